// One parameter-server shard: its variables, its version counter, and the
// state its consistency policy (ps_server/consistency_policy.h: SYNC, ASYNC
// or SSP) reads to decide what becomes of a push and when a pull may read.
//
// A plain thread-safe class with no knowledge of gRPC (ps_service.h adapts
// it), so the update semantics are unit-tested without a network.
//
// A push the policy applies on its own advances the version by one, its
// learning rate scaled as the policy says. Pushes the policy aggregates are
// summed in worker-rank order as they arrive, outside the shard's lock
// (step_aggregate.h; bitwise independent of arrival order); when the policy
// calls the step complete and every admitted push has landed, the sum is
// averaged, applied with one optimizer step, and the version advances by one. Dropped
// pushes are counted. Every valid push, dropped or not, advances its
// worker's clock and records its staleness (the version at arrival minus
// the version it was computed at).
//
// The live set: a worker is live while it has never been heard from (it may
// still be starting), while one of its calls is in flight, or until `lease`
// has passed since its last call. A worker that falls silent leaves the
// live set when its lease runs out (ps_server/lease_tracker.h: on a timer,
// whether or not anyone calls in), so SYNC steps complete and SSP's slowest
// clock moves on without it; any later call brings it back.
//
// A call that must wait (a pull for its version, AwaitWorkersDone) either
// parks its thread on a condition variable of its own (Pull, PullVisit,
// AwaitWorkersDone) or leaves a waiter and returns (PullVisitOrWait,
// AwaitWorkersDoneOrWait: the gRPC service's, so that no thread is held
// per long-poll). Whatever changes what it waits for (a version, a worker
// clock, the live or done set, Init, shutdown) wakes exactly the calls
// that can now proceed; its deadline (for a waiter: on the shard's timer
// thread), or its caller going away, ends the wait otherwise. Stats is a
// pure read.
//
// Invalid requests (unknown variable, wrong shape or dtype, non-finite value,
// future version, a push with no gradient, a pull naming a variable twice,
// push before Init) are refused with InvalidArgument or FailedPrecondition
// before anything is touched.
#ifndef PST_PS_SERVER_PARAMETER_SHARD_H_
#define PST_PS_SERVER_PARAMETER_SHARD_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "config.pb.h"
#include "ps.pb.h"
#include "common/thread_pool.h"
#include "ps_server/consistency_policy.h"
#include "ps_server/lease_tracker.h"
#include "ps_server/step_aggregate.h"
#include "ps_server/variable_store.h"

namespace pst {

// The consistency options (mode, workers, ...) are the policy's.
struct ShardOptions : ConsistencyOptions {
  absl::Duration lease = absl::Seconds(5);
  // The time leases run on; null: the system's. Must outlive the shard.
  const LeaseClock* lease_clock = nullptr;
  // A push streaming into the update (StreamedUpdate) that receives nothing
  // for this long while another update waits for it is cancelled, so that a
  // worker that stalls mid-stream (paused, cut off without a reset) holds
  // the others up for this long, not for its call's whole deadline.
  absl::Duration stalled_stream_timeout = absl::Seconds(5);
  // Copy the state each time the version reaches a multiple of this, for a
  // checkpoint that lands exactly there (0 = never).
  int64_t snapshot_every_steps = 0;
  int shard = 0;
  int num_shards = 1;
  OptimizerConfig optimizer;
};

// The options of shard `shard` of the job `config` describes.
ShardOptions ShardOptionsFromConfig(const JobConfig& config, int shard);

// What a caller of ParameterShard::Push has already established about a
// push, so that Push does not check it again: a pass over a large payload
// costs about as much as applying it.
struct PushChecked {
  bool values_finite = false;  // every gradient value is finite
};

class ParameterShard;

// What a caller adds to a pull's deadline.
struct PullBounds {
  // Pull only: ResourceExhausted, before anything is encoded, if the
  // answer would be larger (rpc_limits.h: PullReplyBytes). 0: no bound.
  int64_t max_reply_bytes = 0;
};

// An ASYNC push applied while its gradient streams in, a piece at a time,
// and committed when the stream ends: the transfer and the update overlap,
// and no copy of the whole gradient is made. The update is staged in the
// shard's staging buffers, so while one exists every other update of the
// shard waits (pulls do not: they read the published values). A stream
// holds one only as long as its data keeps coming; a client that goes away
// ends its call, and the update is dropped with the call.
class StreamedUpdate {
 public:
  ~StreamedUpdate();  // drops the update unless committed
  StreamedUpdate(const StreamedUpdate&) = delete;
  StreamedUpdate& operator=(const StreamedUpdate&) = delete;

  // Applies the gradient of elements [first, first + gradient.size()) of
  // the header's gradient number `tensor`, in stream order (PieceSequence):
  // each element once. A gradient value that is not finite gives a result
  // that is not (every rule scales the gradient into its output or state),
  // which finite() reports and the commit refuses; callers check the
  // gradient first where they can name the culprit for the same cost.
  void Apply(int tensor, int64_t first, std::span<const float> gradient) {
    targets_[tensor].Apply(first, gradient);
  }
  // Whether everything staged for gradient number `tensor` is finite.
  bool finite(int tensor) const { return targets_[tensor].finite(); }

  // Applies gradient number `tensor` whole, elements [0, elements), for a
  // caller that has all of it at hand (a push in a shared region):
  // stage(target, first, count) must apply elements [first, first + count)
  // to `target` (StageTarget::Apply), for consecutive blocks of at most
  // `block` elements. A large gradient is split into parts of whole blocks,
  // staged at once on the shard's threads (as a SYNC step's sum is), each
  // on its own copy of the target, merged after; `stage` must be safe to
  // call from several threads. Returns the first failure of `stage`.
  using StagePart = absl::FunctionRef<absl::Status(VariableStore::StageTarget* target,
                                                   int64_t first, int64_t count)>;
  absl::Status ApplyWhole(int tensor, int64_t elements, int64_t block, StagePart stage);

  // The buffer the header's variable `tensor` is staged into: once
  // elements have been applied, their new values are there, unchanged
  // until the update is committed (and, committed, they are the variable's
  // values). For an exchange whose answer sends each block back as it is
  // staged.
  const Values& staged_values(int tensor) const { return staged_[tensor]; }

  // How the shard ends the stream if it stalls while another update waits
  // (ShardOptions::stalled_stream_timeout): e.g. cancel the call, so that
  // the stream's next read fails and the update is dropped. Thread-safe;
  // set before the first piece. Called at most once.
  void SetCancel(std::function<void()> cancel);
  // The stream delivered data just now.
  void Progressed() { last_progress_ = SteadyNanos(); }

 private:
  friend class ParameterShard;
  explicit StreamedUpdate(ParameterShard* shard) : shard_(shard) {}
  // A monotonic clock: a wall-clock step must not cancel a healthy stream.
  static int64_t SteadyNanos() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  absl::Duration Idle() const { return absl::Nanoseconds(SteadyNanos() - last_progress_.load()); }

  ParameterShard* const shard_;
  std::atomic<int64_t> last_progress_{SteadyNanos()};
  std::function<void()> cancel_;  // guarded by the shard's mu_
  bool cancelled_ = false;        // guarded by the shard's mu_
  int worker_ = 0;
  int64_t computed_at_ = 0;
  int64_t staleness_ = 0;
  std::vector<int> indices_;  // the variables, in header order
  std::vector<VariableStore::StageTarget> targets_;
  // Dropped before the staging is freed, so that the next update does not
  // see them as a pull still holding the buffers.
  std::vector<Values> staged_;
  bool holds_staging_ = true;
};

class ParameterShard {
 public:
  // InvalidArgument for a bad optimizer config, worker count or
  // consistency option.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Create(const ShardOptions& options);
  // Stops the timer thread. Waiters left behind are dropped unrun.
  ~ParameterShard();

  Mode mode() const { return options_.mode; }
  int num_workers() const { return options_.num_workers; }
  // The rules this shard follows, for a caller that must apply them too.
  const ConsistencyPolicy& policy() const { return *policy_; }
  // Bytes of the shard's variables as float32 (0 before Init).
  int64_t parameter_bytes() const;
  // Whether `worker` (of this job) is in the live set now.
  bool WorkerLive(int worker) const;

  absl::Status Register(const RegisterRequest& request, RegisterResponse* response);
  absl::Status Init(const InitRequest& request, InitResponse* response);

  // Waits (up to `deadline`) until the shard is initialized and the policy
  // lets the pull proceed (its version reaches request.min_version; SSP: the
  // worker is within the staleness bound), then copies the requested
  // variables. DeadlineExceeded if the wait runs out; Unavailable once
  // shutting down; InvalidArgument for an unknown or repeated name.
  absl::Status Pull(const PullRequest& request, absl::Time deadline, PullResponse* response,
                    const PullBounds& bounds = {});

  // As Pull, but instead of copying the requested variables into a response
  // it hands them, and the version, to `visit`, which runs under the shard's
  // lock (so it sees one version) and must not call back into the shard: for
  // a caller that encodes them straight into its own messages.
  using PullVisitor =
      std::function<void(int64_t version, const std::vector<const Variable*>& variables)>;
  absl::Status PullVisit(const PullRequest& request, absl::Time deadline,
                         const PullVisitor& visit, const PullBounds& bounds = {});

  // A pull that waits without holding a thread. Under one lock: if
  // `request` may proceed now, or cannot wait (shutting down, `deadline`
  // passed), it runs as PullVisit would without waiting, and the result is
  // 0 (or PullVisit's error); `wake` is dropped. Otherwise it leaves a
  // waiter and returns its id (never 0): `wake` then runs once, when the
  // pull may proceed, the shard begins shutting down or `deadline` passes,
  // on the thread that changed the shard (or the shard's timer thread, for
  // the deadline) with the shard's lock held, so it must be quick and must
  // not call into the shard; the caller then calls PullVisitOrWait again.
  // While it waits, the pull counts in waiting_pulls() and keeps its
  // worker live, as a parked pull does.
  using WaitId = uint64_t;
  absl::StatusOr<WaitId> PullVisitOrWait(const PullRequest& request, absl::Time deadline,
                                         const PullVisitor& visit,
                                         absl::AnyInvocable<void()> wake);
  // Drops waiter `id` (its caller went away): its wake will not run after
  // this returns. False if it had already run (or there is no such waiter).
  bool CancelWait(WaitId id);

  absl::Status Push(const PushRequest& request, PushResponse* response,
                    PushChecked checked = {});
  // As Push, but for a caller that must not block: nullopt, with nothing
  // done, where Push would wait for its turn (behind a streamed update or
  // an unwritten scheduled snapshot). The caller then calls Push from a
  // thread that may wait.
  std::optional<absl::Status> TryPush(const PushRequest& request, PushResponse* response,
                                      PushChecked checked = {});
  // For a caller whose update would wait for its turn (TryPush answered
  // nullopt, or BeginStreamedPush awaits_turn) and that holds no thread
  // while it waits: 0 if the turn may be free now, else a waiter's id, and
  // `wake` runs once (as PullVisitOrWait's does) when the turn may be free,
  // the shard begins shutting down, or a streamed update holding the
  // staging has stalled long enough to be cancelled; the caller then tries
  // again, and may be told to wait again. CancelWait drops the waiter. It
  // counts in waiting_updates().
  WaitId AwaitUpdateTurnOrWait(absl::AnyInvocable<void()> wake);

  // For a push that arrives as a stream (an exchange), given its header:
  // the payload bytes each gradient must carry, taken from the shard's own
  // shapes so that a header cannot make the receiver allocate more than the
  // model; and, when the push can be applied while it streams in (the
  // policy would apply it on its own, no other streamed update is under way,
  // no checkpoint is pending), the update to apply its pieces to. Without one, the caller reassembles
  // the push and calls Push. InvalidArgument for a bad worker or version,
  // an unknown or repeated variable, a wrong shape or an unknown dtype;
  // FailedPrecondition before Init. A refusal is counted. With `may_wait`
  // (a thread that may block) it first waits for its turn, as Push does,
  // when another update is staging or a snapshot is unwritten; without,
  // `awaits_turn` says that is the only reason there is no update, for a
  // caller whose push waits where it lies (a shared region) and would
  // rather call again from such a thread than copy it.
  struct StreamedPush {
    std::vector<int64_t> bytes;
    std::unique_ptr<StreamedUpdate> update;
    bool awaits_turn = false;
  };
  absl::StatusOr<StreamedPush> BeginStreamedPush(const PushRequest& header,
                                                 bool may_wait = false);
  // Makes a streamed update whose every element has been applied visible at
  // once, as Push would have; the same outcomes and counters.
  absl::Status CommitStreamedPush(std::unique_ptr<StreamedUpdate> update,
                                  PushResponse* response);
  // Counts a push refused before it could reach Push (a malformed stream).
  void CountRejectedPush();
  absl::Status Heartbeat(const HeartbeatRequest& request, HeartbeatResponse* response);
  absl::Status Done(const DoneRequest& request, DoneResponse* response);
  // A snapshot of the shard's counters and workers; changes nothing.
  void Stats(StatsResponse* response) const;

  // The chief's wait for the end of training: waits (up to `deadline`) until
  // every worker is done, or the workers' standing differs from what the
  // caller last saw (StatsResponse.worker_changes != request.known_changes:
  // a worker was first heard from, left or rejoined the live set, finished
  // or registered again), then answers as Stats. So a caller that passes
  // each answer's worker_changes back sees every change, and waits in
  // between. OK at the deadline too, with the state then. InvalidArgument
  // for a negative timeout_ms or a known_changes below -1; Unavailable once
  // shutting down.
  absl::Status AwaitWorkersDone(const AwaitWorkersDoneRequest& request, absl::Time deadline,
                                StatsResponse* response);
  // AwaitWorkersDone without holding a thread, as PullVisitOrWait is to
  // PullVisit: 0 once `response` is filled (or an error), else a waiter's
  // id, and `wake` runs once when the caller should call again. The wait
  // counts in waiting_done_calls().
  absl::StatusOr<WaitId> AwaitWorkersDoneOrWait(const AwaitWorkersDoneRequest& request,
                                                absl::Time deadline, StatsResponse* response,
                                                absl::AnyInvocable<void()> wake);

  // The shard's whole state, for a checkpoint.
  ShardCheckpoint Snapshot() const;
  // Loads a checkpoint into a shard that has not been initialized yet (a
  // restarted PS). FailedPrecondition if it already holds variables;
  // InvalidArgument if the checkpoint belongs to another shard or job.
  absl::Status Restore(const ShardCheckpoint& checkpoint);
  int64_t version() const;

  // Waits up to `deadline` for the next snapshot scheduled by
  // snapshot_every_steps and hands it over; nullopt if none came.
  std::optional<ShardCheckpoint> TakeScheduledSnapshot(absl::Time deadline);

  // Checkpoint backpressure. While a writer is attached, a snapshot
  // scheduled by snapshot_every_steps holds every Push until the writer
  // reports it written (or failed), so the newest checkpoint on disk is never
  // more than snapshot_every_steps versions behind: a crash loses at most
  // that. The hold lasts one checkpoint write per snapshot_every_steps.
  void AttachCheckpointWriter();
  void DetachCheckpointWriter();
  void ScheduledSnapshotWritten();

  // What Stats reports of the shard's checkpoint writer.
  void SetCheckpointStats(const CheckpointStats& stats);

  // Wakes every waiting Pull with Unavailable; later calls fail the same way.
  void BeginShutdown();

  // Calls parked in the shard right now: pulls waiting for their version,
  // Init or the staleness bound, and updates waiting for their turn behind
  // an unwritten scheduled snapshot or a streamed update. They tell a stuck
  // step from an idle shard, and let a caller know that a call has reached
  // its wait before it checks what the wait holds back.
  int waiting_pulls() const;
  int waiting_updates() const;
  // AwaitWorkersDone calls parked now.
  int waiting_done_calls() const;
  // Whether a StreamedUpdate holds the staging, holding other updates back.
  bool streamed_update_staged() const;

  const std::string& optimizer_name() const { return optimizer_name_; }

 private:
  // What the policy does not read of a worker (that is in progress_).
  struct WorkerState {
    int64_t last_step = -1;
    int64_t last_staleness = 0;
    int64_t max_staleness = 0;
    int64_t dropped = 0;
  };
  // A call parked until `ready` holds (evaluated under mu_ by whoever
  // changes the shard), the shard shuts down or its deadline passes.
  struct ParkedCall {
    const std::function<bool()>* ready = nullptr;
    absl::CondVar wake;
  };

  // A call waiting without a thread (PullVisitOrWait): woken as a parked
  // call is, or by the timer thread at its deadline.
  struct Waiter {
    WaitId id = 0;
    std::function<bool()> ready;  // evaluated under mu_
    absl::Time deadline;
    absl::AnyInvocable<void()> wake;
    int worker = -1;       // a pull's worker, in flight while it waits
    int* waiting = nullptr;
  };

  ParameterShard(const ShardOptions& options, std::unique_ptr<ConsistencyPolicy> policy,
                 std::unique_ptr<Optimizer> optimizer);

  ShardView View() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return {.version = version_, .workers = progress_};
  }
  absl::Status CheckWorker(int worker) const;
  // Marks `worker` as heard from now (its lease starts again).
  void Touch(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lease tracker's report (on its thread, mu_ held): `workers` left
  // the live set. Completes a step the live set no longer waits for.
  void LeasesExpired(const std::vector<int>& workers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker's standing (seen, live, done) changed: for AwaitWorkersDone.
  void WorkersChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Something a waiter may wait for changed: wakes the update and snapshot
  // waiters (changed_) and the parked calls whose condition now holds.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parks the calling thread as ParkedCall says, counted in `*waiting`.
  void Park(const std::function<bool()>& ready, absl::Time deadline, int* waiting)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leaves `waiter` to be woken; returns its id.
  WaitId AddWaiter(std::unique_ptr<Waiter> waiter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes (and forgets) the waiters that may go on: shutting down, ready,
  // or past their deadline at `now`.
  void WakeWaiters(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The timer thread: wakes each waiter at its deadline.
  void RunWaiterTimer();
  // Everything of PullVisit after its wait.
  absl::Status VisitLocked(const PullRequest& request, const PullVisitor& visit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push, or TryPush when `may_wait` is false.
  std::optional<absl::Status> PushImpl(const PushRequest& request, PushResponse* response,
                                       PushChecked checked, bool may_wait);
  bool AllWorkersDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillStats(StatsResponse* response) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PullMayProceed(int worker, int64_t min_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PullMayProceed(const PullRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InvalidArgument for a pull from an unknown worker or in an unknown
  // wire dtype.
  absl::Status CheckPull(const PullRequest& request) const;
  // Adds the push's gradients to the current step, releasing mu_ while they
  // land, and completes the step if the policy says so.
  void Aggregate(const PushRequest& request, const std::vector<int>& indices,
                 PushResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the push on its own, its learning rate scaled by `lr_scale`.
  absl::Status Apply(const PushRequest& request, const std::vector<int>& indices,
                     float lr_scale, PushResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the step if the policy says so. kSkipped: it completed, but
  // its update would have made the model non-finite, so the model kept its
  // values.
  enum class StepResult { kPending, kApplied, kSkipped };
  StepResult MaybeCompleteStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceVersion() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties the step and sizes it to the store's variables.
  void ResetStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the staged update visible as the next version and answers
  // APPLIED.
  void CommitApplied(PushResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts an accepted push in its worker's clock and staleness figures.
  void RecordPush(int worker, int64_t computed_at, int64_t staleness)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets the next update stage (a StreamedUpdate is done with the staging).
  void ReleaseStaging() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no checkpoint and no streamed update hold updates back,
  // cancelling a streamed update whose stream has stalled.
  void AwaitUpdateTurn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UpdateMayStage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutting_down_ || !(snapshot_unwritten_ || staging_held_);
  }
  // While a streamed update holds the staging: cancels it if it has sent
  // nothing for stalled_stream_timeout, and returns how long until it may
  // have (at least a little, for a holder already cancelled).
  absl::Duration CancelStalledStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  friend class StreamedUpdate;
  ShardCheckpoint SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ShardOptions options_;
  const std::unique_ptr<const ConsistencyPolicy> policy_;
  const std::string optimizer_name_;
  mutable absl::Mutex mu_;
  // Waited on by updates held back (AwaitUpdateTurn) and by
  // TakeScheduledSnapshot; parked calls have their own.
  absl::CondVar changed_;
  std::vector<ParkedCall*> parked_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
  WaitId last_wait_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled when a waiter is added (its deadline may be the earliest)
  // and to stop the timer thread.
  absl::CondVar timer_wake_;
  bool timer_stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread waiter_timer_;  // started by the constructor's body
  VariableStore store_ ABSL_GUARDED_BY(mu_);
  // store_'s parameter_bytes(), set once it holds variables: read on every
  // call's arrival without the lock.
  std::atomic<int64_t> parameter_bytes_{0};
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_pulls_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_updates_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_done_calls_ ABSL_GUARDED_BY(mu_) = 0;
  // Changes of the workers' standing (StatsResponse.worker_changes).
  int64_t worker_changes_ ABSL_GUARDED_BY(mu_) = 0;

  // The current step's gradients, summed as they land, outside mu_;
  // progress_[rank].pushed marks the ranks admitted into it, and landing_
  // counts those whose gradient has not landed yet.
  StepAggregate step_;
  int landing_ ABSL_GUARDED_BY(mu_) = 0;
  // Where a step's large variables are reduced and applied, in up to
  // reduce_parts_ shares (ps_server/sync_reduce.h).
  ThreadPool reduce_threads_;
  const int reduce_parts_ = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));

  std::vector<WorkerProgress> progress_ ABSL_GUARDED_BY(mu_);  // what the policy reads
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  int64_t pushes_applied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_aggregated_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushes_rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t staleness_sum_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<ShardCheckpoint> scheduled_snapshot_ ABSL_GUARDED_BY(mu_);
  bool checkpoint_writer_attached_ ABSL_GUARDED_BY(mu_) = false;
  bool snapshot_unwritten_ ABSL_GUARDED_BY(mu_) = false;
  CheckpointStats checkpoint_stats_ ABSL_GUARDED_BY(mu_);
  // A StreamedUpdate holds the store's staging; other updates wait.
  bool staging_held_ ABSL_GUARDED_BY(mu_) = false;
  StreamedUpdate* staging_holder_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Last: its thread reports into the members above, and stops first.
  LeaseTracker lease_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_PARAMETER_SHARD_H_
