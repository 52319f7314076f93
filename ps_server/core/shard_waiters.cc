#include "ps_server/core/shard_waiters.h"

#include <algorithm>

#include "ps_server/core/lease_tracker.h"

namespace pst {

ShardWaiters::ShardWaiters(absl::Mutex* shard_mu,
                           std::function<void(int worker, bool begins)> in_flight)
    : mu_(shard_mu), in_flight_(std::move(in_flight)) {
  timer_ = StartThreadWithoutSignals([this] { RunTimer(); });
}

ShardWaiters::~ShardWaiters() { Stop(); }

void ShardWaiters::Stop() {
  {
    absl::MutexLock lock(mu_);
    stopping_ = true;
    timer_wake_.Signal();
  }
  if (timer_.joinable()) timer_.join();
}

ShardWaiters::WaitId ShardWaiters::Add(Waiter waiter) {
  mu_->AssertHeld();
  if (waiter.worker >= 0) in_flight_(waiter.worker, true);
  ++*waiter.waiting;
  const WaitId id = ++last_id_;
  waiters_.emplace_back(id, std::move(waiter));
  timer_wake_.Signal();
  return id;
}

void ShardWaiters::Forget(Waiter& waiter) {
  if (waiter.worker >= 0) in_flight_(waiter.worker, false);
  --*waiter.waiting;
}

bool ShardWaiters::Cancel(WaitId id) {
  mu_->AssertHeld();
  auto it = std::find_if(waiters_.begin(), waiters_.end(),
                         [id](const auto& entry) { return entry.first == id; });
  if (it == waiters_.end()) return false;
  Waiter cancelled = std::move(it->second);
  waiters_.erase(it);
  Forget(cancelled);
  return true;
}

void ShardWaiters::Wake(absl::Time now, bool all) {
  mu_->AssertHeld();
  std::vector<Waiter> woken;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter& waiter = it->second;
    if (all || waiter.deadline <= now || waiter.ready()) {
      woken.push_back(std::move(waiter));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  for (Waiter& waiter : woken) {
    Forget(waiter);
    std::move(waiter.wake)();
  }
}

void ShardWaiters::RunTimer() {
  absl::MutexLock lock(mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [id, waiter] : waiters_) next = std::min(next, waiter.deadline);
    timer_wake_.WaitWithDeadline(mu_, next);
    if (!waiters_.empty()) Wake(absl::Now(), /*all=*/false);
  }
}

}  // namespace pst
