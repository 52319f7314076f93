#include "rpc/completion_driver.h"

#include "rpc/completion_tag.h"

namespace pst {

CompletionDriver::~CompletionDriver() {
  queue_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) {
  }
}

bool CompletionDriver::RunOne(absl::Time deadline) {
  void* tag = nullptr;
  bool ok = false;
  if (deadline == absl::InfiniteFuture()) {
    if (!queue_.Next(&tag, &ok)) return false;
  } else if (queue_.AsyncNext(&tag, &ok, absl::ToChronoTime(deadline)) !=
             grpc::CompletionQueue::GOT_EVENT) {
    return false;
  }
  CompletionTag::Run(tag, ok);
  if (followers_.load(std::memory_order_acquire) > 0) {
    // Unlocking re-evaluates the followers' conditions.
    absl::MutexLock lock(&mu_);
  }
  return true;
}

bool CompletionDriver::WaitUntil(absl::FunctionRef<bool()> done, absl::Time deadline) {
  struct Waiter {
    absl::FunctionRef<bool()> done;
    const bool* driving;
    bool Ready() const { return done() || !*driving; }
  };
  absl::MutexLock lock(&mu_);
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    if (driving_) {
      const Waiter waiter{done, &driving_};
      followers_.fetch_add(1, std::memory_order_acq_rel);
      mu_.AwaitWithDeadline(absl::Condition(&waiter, &Waiter::Ready), deadline);
      followers_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    driving_ = true;
    mu_.Unlock();
    bool ran = true;
    while (ran && !done()) ran = RunOne(deadline);
    mu_.Lock();
    driving_ = false;
    // No event before the deadline (the loop's check ends the wait), or
    // none ever: the queue was shut down.
    if (!ran && deadline == absl::InfiniteFuture()) return done();
  }
  return true;
}

}  // namespace pst
