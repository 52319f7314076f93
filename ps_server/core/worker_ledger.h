// What a shard knows of each of its workers (parameter_shard.h): the
// progress its consistency policy reads (clock, live, done, pushed into the
// current step), the staleness and drops Stats reports, and the leases that
// decide the live set (lease_tracker.h).
//
// Not thread-safe on its own: it shares its owner's mutex, and every method
// but the constructor and the destructor is called with it held. The lease
// timer's thread holds it too while it reports, so a lease that runs out and
// a call that renews it are ordered by that one lock.
//
// The ledger counts the changes of the workers' standing (first heard from,
// left or back in the live set, finished, registered again): a waiter for
// them (AwaitWorkersDone) compares changes() with what it last saw.
#ifndef PST_PS_SERVER_CORE_WORKER_LEDGER_H_
#define PST_PS_SERVER_CORE_WORKER_LEDGER_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps.pb.h"
#include "consistency/consistency_policy.h"
#include "ps_server/core/lease_tracker.h"

namespace pst {

class WorkerLedger {
 public:
  // `left` runs on the lease timer's thread with `*mu` held, after workers
  // left the live set (the ledger has marked and logged them). `*mu` and
  // `clock` must outlive the ledger; `shard` names it in the log.
  WorkerLedger(int num_workers, int shard, absl::Duration lease, absl::Mutex* mu,
               std::function<void()> left, const LeaseClock& clock);
  // Stops the lease timer; `*mu` must not be held.
  ~WorkerLedger() = default;
  WorkerLedger(const WorkerLedger&) = delete;
  WorkerLedger& operator=(const WorkerLedger&) = delete;

  // What the policy reads, by rank.
  std::span<const WorkerProgress> progress() const { return progress_; }
  int64_t clock(int worker) const { return progress_[worker].clock; }
  // Changes of the workers' standing so far (StatsResponse.worker_changes).
  int64_t changes() const { return changes_; }

  // `worker` is heard from now (its lease starts again). True if that
  // changed its standing: its first call, or back in the live set.
  bool Heard(int worker);
  // A call of `worker` begins or ends; it stays live while one is in flight.
  void BeginCall(int worker) { lease_.BeginCall(worker); }
  void EndCall(int worker) { lease_.EndCall(worker); }
  bool live(int worker) const { return lease_.live(worker); }
  // Every worker's lease starts again now, as if each had just been heard
  // from: a shard that takes office (ParameterShard::BecomePrimary) heard
  // nothing of the workers while they called its predecessor.
  void RenewAll();

  // `worker` reported Done; true if it had not before.
  bool Finish(int worker);
  // `worker` registered again, so it is no longer done; true if it was.
  bool Rejoin(int worker);
  bool AllDone() const;
  int done_count() const;
  // The workers done now, by rank; and made exactly those (the ranks must
  // be in range): what a primary forwards, and its backup takes.
  std::vector<int> DoneWorkers() const;
  void SetDoneWorkers(std::span<const int> workers);

  // An accepted push of `worker`, computed at `computed_at` and `staleness`
  // versions behind: advances its clock and staleness figures. The mark
  // lets a push that is refused after all leave no trace (Undo).
  struct Mark {
    int worker;
    int64_t clock;
    int64_t last_step;
    int64_t last_staleness;
    int64_t max_staleness;
    int64_t staleness_sum;
  };
  Mark RecordPush(int worker, int64_t computed_at, int64_t staleness);
  void Undo(const Mark& mark);
  void CountDropped(int worker) { ++workers_[worker].dropped; }
  // `worker`'s push is admitted into the current step / the step completed.
  void Admit(int worker) { progress_[worker].pushed = true; }
  void StepCompleted();

  // The per-worker part of Stats: workers, workers_done, live_workers,
  // clock_spread, mean_staleness and worker_changes. Live there means heard
  // from and within the lease; clock_spread spans the workers the policy
  // waits for, which include those not heard from yet.
  void FillStats(StatsResponse* response) const;
  // The clocks, which a checkpoint keeps (a restarted PS resumes SSP).
  void ExportClocks(ShardCheckpoint* checkpoint) const;
  void RestoreClocks(const ShardCheckpoint& checkpoint);

 private:
  // What the policy does not read of a worker.
  struct Figures {
    int64_t last_step = -1;
    int64_t last_staleness = 0;
    int64_t max_staleness = 0;
    int64_t dropped = 0;
  };
  void LeasesExpired(const std::vector<int>& workers);

  const int shard_;
  const absl::Duration lease_duration_;
  const std::function<void()> left_;
  std::vector<WorkerProgress> progress_;
  std::vector<Figures> workers_;
  int64_t staleness_sum_ = 0;
  int64_t changes_ = 0;
  // Last: its thread reports into the members above, and stops first.
  LeaseTracker lease_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_WORKER_LEDGER_H_
