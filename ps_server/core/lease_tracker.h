// Worker leases on a timer, for a shard's live set (parameter_shard.h).
//
// A worker is live while it has never been heard from (it may still be
// starting), while one of its calls is in flight, and until `lease` has
// passed since it was last heard from. The tracker's thread sleeps until the
// earliest lease runs out and then reports the workers whose lease did, so
// the live set changes when time passes, whether or not anyone calls in.
//
// Nothing wakes on a period. (A call waiting in the shard whose caller goes
// away is dropped by the call, as gRPC tells it the call is cancelled:
// ParameterShard::CancelWait.)
//
// The thread takes no asynchronous signal (SIGTERM and the like are the
// process's to handle, on a thread of its choosing).
//
// The tracker shares its owner's mutex: every method but the constructor
// and the destructor is called with it held, and the thread holds it while
// it reports, so a lease that runs out and a call that renews it are
// ordered by that one lock, and the owner's state changes with the report.
#ifndef PST_PS_SERVER_CORE_LEASE_TRACKER_H_
#define PST_PS_SERVER_CORE_LEASE_TRACKER_H_

#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pst {

// The time leases run on, injectable so that tests move it by hand.
class LeaseClock {
 public:
  virtual ~LeaseClock() = default;
  virtual absl::Time Now() const = 0;
  // Waits on `cv`, with `mu` held as CondVar::Wait takes it, until `cv` is
  // signalled or Now() reaches `deadline`. May return early: the caller
  // checks what it waits for again.
  virtual void WaitUntil(absl::Mutex* mu, absl::CondVar* cv, absl::Time deadline) const = 0;
};

// Starts `run` on a thread that takes no asynchronous signal (SIGTERM and
// the like are the process's to handle, on a thread of its choosing; one
// made before the process blocks them would otherwise take them, and die).
std::thread StartThreadWithoutSignals(std::function<void()> run);

// absl::Now(), shared by every tracker that is given no clock.
const LeaseClock& SystemLeaseClock();

// A clock that moves only when Advance is called, for tests: expiry then
// happens at a point the test chooses, however slow the machine. A tracker
// using it must not be destroyed while Advance runs.
class ManualLeaseClock final : public LeaseClock {
 public:
  explicit ManualLeaseClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1)) : now_(start) {}
  absl::Time Now() const override;
  void WaitUntil(absl::Mutex* mu, absl::CondVar* cv, absl::Time deadline) const override;
  // Moves the time on and wakes every waiter, which then sees the new time.
  void Advance(absl::Duration by);
  // Threads waiting in WaitUntil now. Advance takes them all off at once,
  // so after it this counts the ones that have looked at the new time and
  // gone back to sleep: a test knows the tracker has acted on it.
  int sleepers() const;

 private:
  struct Sleeper {
    absl::Mutex* mu;
    absl::CondVar* cv;
  };
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<Sleeper> sleepers_ ABSL_GUARDED_BY(mu_);
};

class LeaseTracker {
 public:
  // `expired` runs on the tracker's thread with `*mu` held, with the workers
  // that just left the live set. `*mu` and `clock` must outlive the tracker.
  LeaseTracker(int num_workers, absl::Duration lease, absl::Mutex* mu,
               std::function<void(const std::vector<int>& workers)> expired,
               const LeaseClock& clock = SystemLeaseClock());
  // Stops the thread; `*mu` must not be held.
  ~LeaseTracker();
  LeaseTracker(const LeaseTracker&) = delete;
  LeaseTracker& operator=(const LeaseTracker&) = delete;

  // What hearing from a worker changed.
  enum class Heard {
    kAgain,      // nothing: it was live and had been heard from
    kFirstTime,  // its first call
    kBack,       // it had left the live set and is back
  };
  // `worker` is heard from now: its lease starts again.
  Heard Touch(int worker);
  // A call of `worker` begins, or ends (which counts as hearing from it);
  // the worker stays live while any is in flight. `worker` must be live.
  void BeginCall(int worker);
  void EndCall(int worker);
  // Every worker heard from before starts a whole lease now, back in the
  // live set if it had left it; the workers back, in rank order.
  std::vector<int> RenewAll();

  bool live(int worker) const;
  // How long since `worker` was last heard from; nullopt if never.
  std::optional<absl::Duration> SinceSeen(int worker) const;

 private:
  struct Lease {
    bool live = true;
    bool ever_seen = false;
    int calls_in_flight = 0;
    absl::Time last_seen = absl::InfinitePast();
  };
  // When `lease` runs out; InfiniteFuture while it cannot (never heard
  // from, a call in flight, already out of the live set).
  absl::Time Expiry(const Lease& lease) const;
  void Run();
  // Reports the workers whose lease has run out by `now`; returns when the
  // next one runs out.
  absl::Time ExpireDue(absl::Time now);
  // Wakes the thread if it sleeps past `when`, and only then: a call that
  // renews a lease costs no wake-up.
  void WakeBy(absl::Time when);

  const absl::Duration lease_;
  absl::Mutex* const mu_;
  const std::function<void(const std::vector<int>&)> expired_;
  const LeaseClock& clock_;
  // Signalled when the next wake-up may come sooner, and to stop.
  absl::CondVar wake_;
  // Guarded by *mu_.
  std::vector<Lease> leases_;
  // When the thread wakes next, unless signalled. InfinitePast until it
  // first looks (and then sees everything anyway).
  absl::Time next_wake_ = absl::InfinitePast();
  bool stopping_ = false;
  std::thread thread_;  // last: it starts once the rest is built
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_LEASE_TRACKER_H_
