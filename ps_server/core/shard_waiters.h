// The calls waiting on a shard without holding a thread: a pull for its
// version, an update for its turn, the chief's AwaitWorkersDone. A waiter
// is a condition, a deadline and a wake callback. Whoever changes what
// waiters wait for calls Wake under the shard's lock, which runs the wake
// of every waiter whose condition now holds; the class's timer thread
// wakes each at its deadline. A woken caller calls the shard again; one
// that goes away drops its waiter (Cancel).
//
// Every method but the constructor and destructor runs with the shard's
// lock held (given to the constructor): the conditions read the shard's
// state, and `in_flight` (which keeps a waiting pull's worker live) is the
// shard's too. The timer thread takes that lock itself.
#ifndef PST_PS_SERVER_CORE_SHARD_WAITERS_H_
#define PST_PS_SERVER_CORE_SHARD_WAITERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pst {

class ShardWaiters {
 public:
  using WaitId = uint64_t;  // never 0

  struct Waiter {
    std::function<bool()> ready;  // evaluated with the shard's lock held
    absl::Time deadline = absl::InfiniteFuture();
    // Runs once, with the shard's lock held: quick, and no call into the
    // shard.
    absl::AnyInvocable<void()> wake;
    int worker = -1;        // a worker kept in flight while it waits, or -1
    int* waiting = nullptr;  // a count of the shard's this waiter is in
  };

  // `in_flight(worker, true)` as a waiter of `worker` starts waiting,
  // `(worker, false)` as it stops.
  ShardWaiters(absl::Mutex* shard_mu, std::function<void(int worker, bool begins)> in_flight);
  // Stop, then waiters left are dropped unrun.
  ~ShardWaiters();
  // Stops the timer thread (idempotent): for an owner whose other threads
  // must not see the timer run while it is being destroyed.
  void Stop();
  ShardWaiters(const ShardWaiters&) = delete;
  ShardWaiters& operator=(const ShardWaiters&) = delete;

  WaitId Add(Waiter waiter);
  // Drops waiter `id` unrun; false if it has run already, or never was.
  bool Cancel(WaitId id);
  // Runs (and forgets) the waiters that may go on: all of them (`all`,
  // the shard shutting down), those past their deadline at `now`, and
  // those whose condition holds.
  void Wake(absl::Time now, bool all);

 private:
  void RunTimer();
  void Forget(Waiter& waiter);

  absl::Mutex* const mu_;
  const std::function<void(int, bool)> in_flight_;
  // Guarded by *mu_.
  std::vector<std::pair<WaitId, Waiter>> waiters_;
  WaitId last_id_ = 0;
  bool stopping_ = false;
  // Signalled when a waiter is added (its deadline may be the earliest)
  // and to stop the timer.
  absl::CondVar timer_wake_;
  std::thread timer_;  // last: started once the members above exist; joined by Stop
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SHARD_WAITERS_H_
