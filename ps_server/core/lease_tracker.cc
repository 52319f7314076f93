#include "ps_server/core/lease_tracker.h"

#include <pthread.h>

#include <algorithm>
#include <csignal>

#include "absl/time/clock.h"

namespace pst {
namespace {

class SystemClock final : public LeaseClock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void WaitUntil(absl::Mutex* mu, absl::CondVar* cv, absl::Time deadline) const override {
    cv->WaitWithDeadline(mu, deadline);
  }
};

}  // namespace

// A process that handles SIGTERM on a thread of its own (ps_server) blocks
// it before it starts its threads, but a shard, and so its tracker, may be
// made before that. Faults still reach the thread that raises them.
std::thread StartThreadWithoutSignals(std::function<void()> run) {
  sigset_t blocked, before;
  sigfillset(&blocked);
  for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) {
    sigdelset(&blocked, fault);
  }
  pthread_sigmask(SIG_BLOCK, &blocked, &before);
  std::thread thread(std::move(run));  // inherits the mask
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return thread;
}

const LeaseClock& SystemLeaseClock() {
  static const SystemClock* clock = new SystemClock();
  return *clock;
}

absl::Time ManualLeaseClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void ManualLeaseClock::WaitUntil(absl::Mutex* mu, absl::CondVar* cv, absl::Time deadline) const {
  {
    // The time is read and the sleeper registered in one step, and *mu is
    // held until the wait begins: an Advance either comes first (and is
    // seen here) or finds the sleeper and signals it under *mu, waiting.
    absl::MutexLock lock(&mu_);
    if (now_ >= deadline) return;
    sleepers_.push_back({mu, cv});
  }
  cv->Wait(mu);
  // Still listed if woken by someone other than Advance.
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(sleepers_.begin(), sleepers_.end(),
                         [&](const Sleeper& s) { return s.mu == mu && s.cv == cv; });
  if (it != sleepers_.end()) sleepers_.erase(it);
}

int ManualLeaseClock::sleepers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sleepers_.size());
}

void ManualLeaseClock::Advance(absl::Duration by) {
  std::vector<Sleeper> sleepers;
  {
    absl::MutexLock lock(&mu_);
    now_ += by;
    sleepers.swap(sleepers_);
  }
  for (const Sleeper& s : sleepers) {
    absl::MutexLock lock(s.mu);
    s.cv->SignalAll();
  }
}

LeaseTracker::LeaseTracker(int num_workers, absl::Duration lease, absl::Mutex* mu,
                           std::function<void(const std::vector<int>& workers)> expired,
                           const LeaseClock& clock)
    : lease_(lease),
      mu_(mu),
      expired_(std::move(expired)),
      clock_(clock),
      leases_(num_workers),
      thread_(StartThreadWithoutSignals([this] { Run(); })) {}

LeaseTracker::~LeaseTracker() {
  {
    absl::MutexLock lock(mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  thread_.join();
}

absl::Time LeaseTracker::Expiry(const Lease& lease) const {
  if (!lease.ever_seen || !lease.live || lease.calls_in_flight > 0) {
    return absl::InfiniteFuture();
  }
  return lease.last_seen + lease_;
}

LeaseTracker::Heard LeaseTracker::Touch(int worker) {
  mu_->AssertHeld();
  Lease& lease = leases_[worker];
  const Heard heard = !lease.ever_seen ? Heard::kFirstTime
                      : !lease.live    ? Heard::kBack
                                       : Heard::kAgain;
  lease.ever_seen = true;
  lease.live = true;
  lease.last_seen = clock_.Now();
  // A renewed lease only ends later, which the thread finds when it wakes;
  // one that had no end has one now.
  if (heard != Heard::kAgain) WakeBy(Expiry(lease));
  return heard;
}

std::vector<int> LeaseTracker::RenewAll() {
  mu_->AssertHeld();
  std::vector<int> back;
  const absl::Time now = clock_.Now();
  for (int worker = 0; worker < static_cast<int>(leases_.size()); ++worker) {
    Lease& lease = leases_[worker];
    if (!lease.ever_seen) continue;
    if (!lease.live) back.push_back(worker);
    lease.live = true;
    lease.last_seen = now;
  }
  WakeBy(now + lease_);
  return back;
}

void LeaseTracker::BeginCall(int worker) {
  mu_->AssertHeld();
  ++leases_[worker].calls_in_flight;
}

void LeaseTracker::EndCall(int worker) {
  mu_->AssertHeld();
  Lease& lease = leases_[worker];
  --lease.calls_in_flight;
  lease.last_seen = clock_.Now();
  WakeBy(Expiry(lease));  // with no call left, its lease runs again
}

bool LeaseTracker::live(int worker) const {
  mu_->AssertHeld();
  return leases_[worker].live;
}

std::optional<absl::Duration> LeaseTracker::SinceSeen(int worker) const {
  mu_->AssertHeld();
  const Lease& lease = leases_[worker];
  if (!lease.ever_seen) return std::nullopt;
  return clock_.Now() - lease.last_seen;
}

void LeaseTracker::WakeBy(absl::Time when) {
  if (when < next_wake_) {
    next_wake_ = when;
    wake_.Signal();
  }
}

void LeaseTracker::Run() {
  absl::MutexLock lock(mu_);
  while (!stopping_) {
    const absl::Time now = clock_.Now();
    next_wake_ = ExpireDue(now);
    clock_.WaitUntil(mu_, &wake_, next_wake_);
  }
}

absl::Time LeaseTracker::ExpireDue(absl::Time now) {
  std::vector<int> expired;
  absl::Time next = absl::InfiniteFuture();
  for (size_t i = 0; i < leases_.size(); ++i) {
    const absl::Time expiry = Expiry(leases_[i]);
    if (expiry <= now) {
      leases_[i].live = false;
      expired.push_back(static_cast<int>(i));
    } else {
      next = std::min(next, expiry);
    }
  }
  if (!expired.empty()) expired_(expired);
  return next;
}

}  // namespace pst
