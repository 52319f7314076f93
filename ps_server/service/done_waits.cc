#include "ps_server/service/done_waits.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/transient_refusal.h"
#include "rpc/grpc_status.h"

namespace pst {

// One call's wait: a waiter in the shard while it waits. Answered once, as
// the waiter wakes, as its caller goes away, or as a newer wait of the
// same worker supersedes it.
class DoneWaits::Wait : public std::enable_shared_from_this<Wait> {
 public:
  Wait(DoneWaits* owner, Call* call, std::optional<int> worker, absl::Time deadline)
      : owner_(owner), call_(call), worker_(worker), deadline_(deadline) {}

  std::optional<int> worker() const { return worker_; }

  // Answers if it can, else leaves a waiter whose wake calls again.
  void Step() {
    absl::Status finish;
    {
      absl::MutexLock lock(&mu_);
      wait_ = 0;
      if (finished_) return;
      if (cancelled_) {
        finish = absl::CancelledError("the caller went away while AwaitWorkersDone waited");
      } else {
        // A superseded wait answers the state now: its deadline has passed.
        absl::StatusOr<ParameterShard::WaitId> waited = owner_->shard_->AwaitWorkersDoneOrWait(
            call_->request(), superseded_ ? absl::InfinitePast() : deadline_, call_->response(),
            [self = shared_from_this()] { self->owner_->threads_->Post([self] { self->Step(); }); });
        if (waited.ok() && *waited != 0) {
          wait_ = *waited;
          return;
        }
        finish = waited.ok() ? absl::OkStatus() : waited.status();
      }
      finished_ = true;
    }
    owner_->Release(this);
    call_->Finish(ToGrpcStatus(finish));
  }

  // The caller went away: the waiter is dropped, and the call finished.
  void Cancel() { Interrupt(&cancelled_); }
  // A newer wait of the same worker took this one's place: answered now.
  void Supersede() { Interrupt(&superseded_); }

 private:
  void Interrupt(bool* flag) {
    ParameterShard::WaitId waiting = 0;
    {
      absl::MutexLock lock(&mu_);
      *flag = true;
      waiting = wait_;
    }
    // Where the waiter has run already, its wake answers with the flag set.
    if (waiting != 0 && owner_->shard_->CancelWait(waiting)) Step();
  }

  DoneWaits* const owner_;
  Call* const call_;
  const std::optional<int> worker_;
  const absl::Time deadline_;
  absl::Mutex mu_;
  ParameterShard::WaitId wait_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool superseded_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

DoneWaits::DoneWaits(ParameterShard* shard, ThreadPool* threads, int observer_cap)
    : shard_(shard),
      threads_(threads),
      observer_cap_(observer_cap),
      by_worker_(static_cast<size_t>(std::max(0, shard->num_workers()))) {}

void DoneWaits::Serve(Call* call, std::optional<int> worker, absl::Time deadline) {
  auto wait = std::make_shared<Wait>(this, call, worker, deadline);
  std::shared_ptr<Wait> superseded;
  {
    absl::MutexLock lock(&mu_);
    if (!worker) {
      // Each observer costs a waiter that every change of the shard looks at.
      if (observers_ >= observer_cap_) {
        call->Finish(ToGrpcStatus(MarkTransient(
            absl::ResourceExhaustedError(absl::StrCat(
                "this PS already has ", observer_cap_,
                " AwaitWorkersDone calls of observers waiting, its limit "
                "(--max_streams); try again later, or name the worker you wait as")),
            TransientRefusal::kOverloaded)));
        return;
      }
      ++observers_;
    } else {
      std::deque<std::shared_ptr<Wait>>& own = by_worker_[static_cast<size_t>(*worker)];
      own.push_back(wait);
      if (own.size() > kPerWorker) {
        superseded = std::move(own.front());
        own.pop_front();
      }
    }
  }
  if (superseded) superseded->Supersede();
  call->SetOnCancel([wait] { wait->Cancel(); });
  wait->Step();
}

void DoneWaits::Release(const Wait* wait) {
  absl::MutexLock lock(&mu_);
  if (!wait->worker()) {
    --observers_;
    return;
  }
  std::deque<std::shared_ptr<Wait>>& own = by_worker_[static_cast<size_t>(*wait->worker())];
  auto held = std::find_if(own.begin(), own.end(),
                           [wait](const std::shared_ptr<Wait>& w) { return w.get() == wait; });
  if (held != own.end()) own.erase(held);  // a superseded one is gone already
}

int DoneWaits::waiting_of(int worker) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(by_worker_[static_cast<size_t>(worker)].size());
}

int DoneWaits::observers_waiting() const {
  absl::MutexLock lock(&mu_);
  return observers_;
}

}  // namespace pst
