// One parameter-server shard: its variables, its version counter, and the
// state its consistency policy (consistency/consistency_policy.h: SYNC, ASYNC
// or SSP) reads to decide what becomes of a push and when a pull may read.
//
// A plain thread-safe class with no knowledge of gRPC (ps_service.h adapts
// it), so the update semantics are unit-tested without a network.
//
// The shard coordinates; its tables hold the state (ps_server/core/shard_tables.h:
// embedding rows addressed by id and dense variables), each update staged
// in all of them and committed at once, as one version. A push may carry
// dense gradients, embedding rows or both; a pull names dense variables
// and rows, and sees both at one version.
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
// live set when its lease runs out (ps_server/core/lease_tracker.h: on a timer,
// whether or not anyone calls in), so SYNC steps complete and SSP's slowest
// clock moves on without it; any later call brings it back.
//
// A call that must wait (a pull for its version, an update for its turn,
// AwaitWorkersDone) leaves a waiter and returns (ps_server/core/shard_waiters.h):
// no thread is held while it waits. Each ...OrWait call answers 0 when it
// has run (or an error), else its waiter's id; `wake` then runs once, when
// the call may go on, the shard begins shutting down or the deadline
// passes, on the thread that changed the shard (or the shard's timer
// thread) with the shard's lock held, so it must be quick and must not call
// into the shard. The caller then calls again (and may be told to wait
// again), or drops the waiter with CancelWait. Whatever changes what a
// call waits for (a version, a worker clock, the live or done set, Init,
// the staging, shutdown) wakes exactly the calls that can now proceed.
// Each call has one entry point, used by every transport, the tests and
// the fuzzers alike; ps_server/core/shard_calls.h wraps them for a caller that
// may block a thread. Stats is a pure read.
//
// Replicas. With options.replicas > 1 the shard is held by that many
// processes: one primary, the rest its backups. The primary forwards what
// each version changes (ReplicaUpdate: the dense variables' optimizer
// steps, the rows changed and removed with their state, the worker
// clocks; the state whole to a backup
// that has none, or is too far behind) and counts a version replicated
// once every backup in the commit rule acknowledges it. A backup that is
// new or came back is sent the state whole and the updates after it while
// training goes on, and joins the rule once it is fewer than
// kMaxUnreplicated versions behind; it joins the chain (may take over)
// once it also holds every version acknowledged before it joined. The
// commit rule: a pull waits until the version it asks for (min_version) and the worker's own last
// applied push are replicated; so no worker is told of an update a
// backup lacks, and in SYNC, where a pull shows exactly the step it
// waited for, none reads one either. (An ASYNC pull may show other
// workers' updates still on their way to the backups, as it may show
// updates that land after it.) A backup (ApplyReplicaUpdate) applies the
// same dense steps and copies the rows, so it holds bitwise what the
// primary held at that version, and
// refuses an update from an epoch older than one it has seen (fencing).
// While no live backup lags, the primary runs as an unreplicated shard; it
// holds updates back while a backup in the rule is kMaxUnreplicated
// versions behind.
//
// Invalid requests (unknown variable or table, wrong shape or dtype,
// non-finite value, future version, a push with neither gradients nor rows,
// a pull naming a variable twice, a row id of another shard, push before
// Init) are refused with InvalidArgument or FailedPrecondition
// before anything is touched.
#ifndef PST_PS_SERVER_CORE_PARAMETER_SHARD_H_
#define PST_PS_SERVER_CORE_PARAMETER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/replication_limits.h"
#include "consistency/consistency_policy.h"
#include "ps.pb.h"
#include "ps_server/core/pulled_rows.h"
#include "ps_server/core/push_counters.h"
#include "ps_server/core/shard_options.h"
#include "ps_server/core/shard_tables.h"
#include "ps_server/core/shard_waiters.h"
#include "ps_server/core/snapshot_schedule.h"
#include "ps_server/core/streamed_staging.h"
#include "ps_server/core/table.h"
#include "ps_server/core/worker_ledger.h"

namespace pst {

class StreamedUpdate;  // ps_server/core/streamed_update.h

class ParameterShard {
 public:
  // InvalidArgument for a bad optimizer config, worker count or
  // consistency option.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Create(const ShardOptions& options);
  // Stops the timer thread. Waiters left behind are dropped unrun.
  ~ParameterShard();

  Mode mode() const { return options_.mode; }
  int num_workers() const { return options_.num_workers; }
  int shard() const { return options_.shard; }
  // This process's place among the shard's replicas (Replicas below).
  int replica() const { return options_.replica; }
  int replicas() const { return options_.replicas; }
  // Whether the primary is elected (ShardOptions.elected).
  bool elected() const { return options_.elected; }
  // This shard's share of the config's model; nullopt when the workers bring their own.
  // Fixed when the shard is made, so read without the lock.
  const std::optional<ConfigModel>& model_share() const {
    return ABSL_TS_UNCHECKED_READ(tables_).model_share();
  }
  // The rules this shard follows, for a caller that must apply them too.
  const ConsistencyPolicy& policy() const { return *policy_; }
  // Bytes of the shard's variables as float32 (0 before Init).
  int64_t parameter_bytes() const;
  // Whether `worker` (of this job) is in the live set now.
  bool WorkerLive(int worker) const;

  absl::Status Register(const RegisterRequest& request, RegisterResponse* response);
  absl::Status Init(const InitRequest& request, InitResponse* response);

  // A pull hands the variables it asked for, the rows it names and the
  // version to a visitor, which runs under the shard's lock (so it sees
  // one version) and must not call back into the shard: the caller encodes
  // them straight into its own messages.
  using PullVisitor = std::function<void(
      int64_t version, const std::vector<const Variable*>& variables, const PulledRows& rows)>;

  // The pull: once the shard is initialized and the policy lets it
  // proceed (its version reaches request.min_version; SSP: the worker is
  // within the staleness bound), `visit` sees the requested variables,
  // under the lock that checked. One that cannot wait runs at once
  // (shutting down: Unavailable; `deadline` passed: DeadlineExceeded).
  // InvalidArgument for an unknown or repeated name, or rows
  // EmbeddingTable::CheckPull refuses. While it waits, the pull counts in
  // waiting_pulls() and keeps its worker live.
  using WaitId = ShardWaiters::WaitId;
  // Bytes the rows `pull` names take in its answer (ids x dim x wire
  // bytes per table; nothing for a table this shard lacks, which the pull
  // refuses), from the request's sizes: no row is looked at.
  int64_t RowsAnswerBytes(const PullRequest& pull) const;
  // Starts reading the cold rows `pull` names from the tables' disk tiers
  // (EmbeddingTable::Prefetch): called when an exchange arrives, before it
  // waits for its step, so that its answer and the next update find them.
  // Takes the shard's lock only where a table reads ahead.
  void PrefetchRows(const PullRequest& pull) const;
  absl::StatusOr<WaitId> PullVisitOrWait(const PullRequest& request, absl::Time deadline,
                                         const PullVisitor& visit,
                                         absl::AnyInvocable<void()> wake);
  // Drops waiter `id` (its caller went away): its wake will not run after
  // this returns. False if it had already run (or there is no such waiter).
  bool CancelWait(WaitId id);

  // The push, applied or aggregated as the policy says; nullopt, with
  // nothing done, where it must wait for its turn (behind a streamed update
  // or an unwritten scheduled snapshot): the caller then waits with
  // AwaitUpdateTurnOrWait and calls again.
  std::optional<absl::Status> TryPush(const PushRequest& request, PushResponse* response,
                                      PushChecked checked = {});
  // For an update that would wait for its turn (TryPush answered nullopt,
  // or BeginStreamedPush awaits_turn): 0 if the turn may be free now. Its
  // wake also runs once a streamed update holding the staging has stalled
  // long enough to be cancelled. It counts in waiting_updates().
  WaitId AwaitUpdateTurnOrWait(absl::AnyInvocable<void()> wake);

  // For a push answered alone (an exchange that does not read), once
  // applied: 0 when every backup in the commit rule holds the versions this
  // worker's pushes made (at once on a shard without backups), else a waiter
  // whose wake runs when they do. The answer acknowledges the push, as a
  // pull's does (Replicas, above). Unavailable shutting down, and the
  // kNotPrimary refusal for a primary that stepped down meanwhile: the
  // worker sends the push again to its successor, which applies it at most
  // once (its sequence).
  absl::StatusOr<WaitId> AwaitPushReplicatedOrWait(int worker, absl::AnyInvocable<void()> wake);

  // For a push that arrives as a stream (an exchange), given its header:
  // the payload bytes each gradient must carry, taken from the shard's own
  // shapes so that a header cannot make the receiver allocate more than the
  // model; and, when the push can be applied while it streams in (the
  // policy would apply it on its own, no other streamed update is under way,
  // no checkpoint is pending, and the header carries no embedding rows,
  // which only Push applies), the update to apply its pieces to. Without
  // one, the caller reassembles the push and calls Push. InvalidArgument
  // for a bad worker or version, an unknown or repeated variable, a wrong
  // shape or an unknown dtype; FailedPrecondition before Init. A refusal is counted. `awaits_turn`
  // says that another update staging, or an unwritten snapshot, is the only
  // reason there is no update, for a caller whose push waits where it lies
  // (a shared region) and would rather wait for its turn
  // (AwaitUpdateTurnOrWait) and call again than copy it.
  struct StreamedPush {
    std::vector<int64_t> bytes;
    std::unique_ptr<StreamedUpdate> update;
    bool awaits_turn = false;
  };
  absl::StatusOr<StreamedPush> BeginStreamedPush(const PushRequest& header);
  // Whether an exchange whose push is `update` may answer its pull (at
  // least `min_version`) with the values as they are staged: the policy's
  // AnswerMayStreamDuringPush, or, for a SYNC step of this one push, whether
  // the step's version is enough.
  bool AnswerMayStreamDuringPush(const StreamedUpdate& update, int64_t min_version) const;
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

  // The chief's wait for the end of training: answers as Stats once every
  // worker is done, or the workers' standing differs from what the caller
  // last saw (StatsResponse.worker_changes != request.known_changes: a
  // worker was first heard from, left or rejoined the live set, finished
  // or registered again), or `deadline` passes (OK, with the state then).
  // So a caller that passes each answer's worker_changes back sees every
  // change, and waits in between. InvalidArgument for a negative
  // timeout_ms or a known_changes below -1; Unavailable once shutting down.
  // The wait counts in waiting_done_calls().
  absl::StatusOr<WaitId> AwaitWorkersDoneOrWait(const AwaitWorkersDoneRequest& request,
                                                absl::Time deadline, StatsResponse* response,
                                                absl::AnyInvocable<void()> wake);

  // The shard's whole state, for a checkpoint.
  ShardCheckpoint Snapshot() const;
  // The shard's state for its checkpoint writer, which writes every one
  // it takes (a scheduled snapshot is one too). With checkpoint_full_every
  // > 1 each is a link of a chain: a full one, then deltas
  // (ShardCheckpoint.delta) over the one before, up to full_every links;
  // a delta only where the version moved since the previous link and the
  // embedding tables tracked their changes since (not after an Init or a
  // Restore). Otherwise as Snapshot.
  ShardCheckpoint CheckpointSnapshot();
  // The next link is full: the writer lost one (a write failed), so a
  // delta over it would not restore. (A delta captured over it meanwhile,
  // by a scheduled snapshot, is written all the same; a restore skips it
  // for the newest whole chain.) Detaching the writer does the same.
  void RestartCheckpointChain();
  // Loads a checkpoint into a shard that has not been initialized yet (a
  // restarted PS). FailedPrecondition if it already holds variables;
  // InvalidArgument if the checkpoint belongs to another shard or job.
  absl::Status Restore(const ShardCheckpoint& checkpoint);
  int64_t version() const;
  // Whether Init or Restore has given the shard its variables (it never
  // loses them).
  bool initialized() const;

  // Waits up to `deadline` for the next snapshot scheduled by
  // snapshot_every_steps and hands it over; nullopt if none came.
  std::optional<ShardCheckpoint> TakeScheduledSnapshot(absl::Time deadline);

  // Checkpoint backpressure (ps_server/core/snapshot_schedule.h): while a
  // writer is attached, a scheduled snapshot holds every update until the
  // writer reports it written (or failed).
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

  // Replicas (above). Indexes are the replicas' places, 0 to
  // options.replicas - 1; this process's own is options.replica.
  static constexpr int64_t kMaxUnreplicated = kMaxUnreplicatedVersions;
  static constexpr int64_t kMinCatchUpLogBytes = int64_t{64} << 20;
  bool primary() const;
  int64_t epoch() const;
  // How an office begins. A job's first (no chain yet): every live backup
  // counts in the commit rule, and nothing is acknowledged until its first
  // chain (ChainToPublish) is published. After a chain: the backups join
  // the rule as they catch up, while training goes on.
  enum class Office { kFirstOfJob, kAfterAChain };
  // The primary's side. Makes this process the primary at `epoch` (its
  // office: membership), forwarding from its version on; every backup
  // starts with the state whole. FailedPrecondition for an epoch not above
  // every one it has seen.
  absl::Status BecomePrimary(int64_t epoch, Office office);
  // Leaves office (its lease lapsed, or another replica holds it): workers
  // are refused from now on, pulls waiting included, and the next primary's
  // state replaces what this process holds.
  void StepDown();
  // The primary's backups that count in the commit rule and hold every
  // update acknowledged to a worker (what the primary held when they joined
  // the rule, and since): with the primary, the chain its membership
  // publishes, the replicas that may take over from it.
  std::vector<int> CaughtUpBackups() const;
  // The backups of the chain the office publishes now: CaughtUpBackups;
  // in a job's first office, nullopt until every backup that counts in the
  // commit rule is among them (a backup dropped no longer counts).
  std::optional<std::vector<int>> ChainToPublish() const;
  // The backups of the chain its membership has published (a subset of
  // CaughtUpBackups a moment ago): those that may take over, as Stats
  // reports them (before the first call, CaughtUpBackups; none in a job's
  // first office, which then starts acknowledging).
  void ChainPublished(const std::vector<int>& backups);
  // A job's first office that has not published its first chain yet.
  bool awaits_first_chain() const;
  // Whether this process holds a state its primary sent it, whole or
  // updated since.
  bool holds_state() const;
  // Every worker is done and this replica holds the state they left: a
  // backup told a worker's Done directly, at the primary's version then,
  // holds it once it has applied that version. What a checkpoint marks
  // `finished`.
  bool holds_final_state() const;
  // What backup `replica` needs next, in version order: the updates after
  // the last version sent to it, or the state whole (not sent anything
  // since it went live or was resynced past the log). Waits until there is
  // something, or `deadline` passes (an empty list). Unavailable once
  // shutting down; FailedPrecondition when not primary or for a bad index.
  // The log holds each update once, shared with the senders: one of a large
  // dense model is megabytes.
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> TakeReplicaUpdates(
      int replica, absl::Time deadline);
  // Backup `replica` acknowledged `version` (ReplicaAck.version).
  void ReplicaAcked(int replica, int64_t version);
  // Backup `replica` holds `version` (-1: nothing of this state) and
  // nothing sent after it (it refused or lost them): it is sent what
  // follows `version`, or the state whole.
  void ReplicaResync(int replica, int64_t version);
  // Whether backup `replica` counts in the commit rule; one that comes
  // back is sent the state whole. Every backup starts live.
  void SetReplicaLive(int replica, bool live);
  // The version every live backup holds (version() when none is live).
  int64_t replicated_version() const;
  // The backup's side: applies `update` and acknowledges it in `ack`
  // (also on refusal: what the backup holds). FailedPrecondition for an
  // epoch older than one seen, an update over another version than the
  // backup's (ack says which), or on the primary of the same epoch; a
  // primary told of a newer epoch becomes a backup. InvalidArgument for an
  // update the tables refuse; an update that fails half applied leaves the
  // backup needing the state whole.
  //
  // `acknowledge` runs once an update is known to apply, with `*ack`
  // saying it is applied, under the shard's lock: for a version's update
  // once it is checked and before its rows are written (the backup's
  // answer then travels while it writes them), else once applied. It does
  // not run for a refusal. An error after it (a disk tier failing) leaves
  // the backup holding no state: it refuses what follows, and the primary
  // sends it the state whole; nothing acknowledged is lost while the
  // primary lives, and a backup holding no state never takes over.
  absl::Status ApplyReplicaUpdate(const ReplicaUpdate& update, ReplicaAck* ack,
                                  absl::FunctionRef<void()> acknowledge);
  absl::Status ApplyReplicaUpdate(const ReplicaUpdate& update, ReplicaAck* ack);

 private:
  ParameterShard(const ShardOptions& options, std::unique_ptr<ConsistencyPolicy> policy,
                 std::unique_ptr<Optimizer> optimizer);

  ShardView View() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return {.version = version_, .workers = ledger_.progress()};
  }
  absl::Status CheckWorker(int worker) const;
  // Marks `worker` as heard from now (its lease starts again).
  void Touch(int worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ledger's report (on its lease timer's thread, mu_ held): workers
  // left the live set. Completes a step the live set no longer waits for.
  void WorkersLeft() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Something a waiter may wait for changed: wakes the snapshot's taker
  // and the waiters whose condition now holds.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pull, once it waits no more.
  absl::Status VisitLocked(const PullRequest& request, const PullVisitor& visit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillStats(StatsResponse* response) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PullMayProceed(int worker, int64_t min_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a push refused and passes its refusal on.
  absl::Status Refuse(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++pushes_.rejected;
    return status;
  }
  // TryPush's part under the lock: refuses, drops or applies the push, or
  // admits it into the current step (`*lands`: the caller lands it in each
  // table, as `plans` says, outside the lock, then completes the step if it
  // can).
  std::optional<absl::Status> DecidePush(const PushRequest& request, PushChecked checked,
                                         PushResponse* response, std::vector<TablePush>* plans,
                                         bool* lands) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the step if the policy says so: APPLIED, or SKIPPED where its
  // update would have made the model non-finite, so the model kept its
  // values; AGGREGATED while the step is not complete.
  PushResponse::Outcome MaybeCompleteStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current step with the update `staged` says was staged (or
  // refused): APPLIED or SKIPPED, as MaybeCompleteStep.
  PushResponse::Outcome CompleteStep(const absl::Status& staged)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceVersion() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the staged update visible as the next version and answers
  // APPLIED.
  void CommitApplied(int worker, PushResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets the next update stage (a StreamedUpdate is done with the staging).
  void ReleaseStaging() ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseStagingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UpdateMayStage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutting_down_ || !(snapshots_.holds_updates() || staging_.held() ||
                               version_ - ReplicatedLocked() >= kMaxUnreplicated);
  }
  // Replicas (parameter_shard_replica.cc).
  bool Forwards() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return options_.replicas > 1 && primary_;
  }
  int64_t ReplicatedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The version the last push of `worker` this shard took takes effect at
  // (PushResponse.DUPLICATE's version): its SYNC step's, the next version
  // while that step waits, else its own; the shard's version where unknown.
  int64_t RepeatTakesEffectAt(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The version a push claims to be computed at (CheckPushClaims), for a
  // worker already checked: one past this shard's from a worker not yet
  // registered with this process is a restart it has not seen
  // (PushAheadOfARestartedShard).
  absl::Status CheckClaims(const PushRequest& push) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether what a pull of `worker` at `min_version` shows is replicated.
  bool Replicated(int worker, int64_t min_version) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs the update that made version_ for the backups.
  void ForwardVersion() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state went whole (Init, Restore, a new office): every backup is
  // sent it whole next, and the log starts again. A backup that counts in
  // the commit rule keeps counting (updates wait for it to take the state)
  // unless a new office begins (then as Office says).
  void RestartForwarding(std::optional<Office> new_office = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the log's updates no live backup needs: those every backup in the
  // commit rule acknowledged, unless one catching up needs them; a backup
  // catching up whose log would outgrow the state is sent it whole again.
  void TrimReplicaLog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a backup answers its primary: the version it holds (-1: none) and its epoch.
  void AnswerReplica(ReplicaAck* ack) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReplicationStats, for a shard with backups.
  void FillReplicationStats(ReplicationStats* stats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition for a worker's update on a backup.
  absl::Status CheckPrimary() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `request` repeats a push this shard took from its worker
  // (PushRequest.sequence below the worker's clock).
  bool RepeatedPush(const PushRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  friend class StreamedUpdate;
  // The state now, its dense variables copied into `presized`'s
  // (PresizedCheckpoint) where it has them; notes the time it took in
  // last_capture_.
  ShardSnapshot SnapshotLocked(CaptureKind kind = CaptureKind::kWhole,
                               ShardCheckpoint presized = {}) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next link of the checkpoint chain (CheckpointSnapshot).
  ShardSnapshot ChainSnapshotLocked(ShardCheckpoint presized = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A checkpoint holding the dense variables' bytes, sized and written
  // outside the lock (VariableStore::PresizeExport) for SnapshotLocked.
  ShardCheckpoint PresizedCheckpoint() const ABSL_LOCKS_EXCLUDED(mu_);

  const ShardOptions options_;
  const std::unique_ptr<const ConsistencyPolicy> policy_;
  const std::string optimizer_name_;
  mutable absl::Mutex mu_;
  SnapshotSchedule snapshots_ ABSL_GUARDED_BY(mu_);
  // How long the last SnapshotLocked took (CheckpointStats.capture_micros).
  mutable absl::Duration last_capture_ ABSL_GUARDED_BY(mu_);
  // The checkpoint chain so far: the version of its last link (-1: none;
  // the next link is full), of its full link, and its links.
  struct CheckpointChain {
    int64_t parent = -1;
    int64_t base = -1;
    int64_t links = 0;
  };
  CheckpointChain chain_ ABSL_GUARDED_BY(mu_);
  // Keeps a waiting pull's worker in flight (ledger_ is declared later:
  // used only once both exist, and the destructor stops the timer first).
  ShardWaiters waiters_{&mu_, [this](int worker, bool begins) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                          if (begins) {
                            ledger_.BeginCall(worker);
                          } else {
                            ledger_.EndCall(worker);
                          }
                        }};
  // Fixed at construction; Land and parameter_bytes() run outside mu_.
  ShardTables tables_ ABSL_GUARDED_BY(mu_);
  // Whether a table of tables_ reads its disk tier ahead: set with the
  // tables, read by PrefetchRows without the lock.
  std::atomic<bool> reads_ahead_{false};
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_pulls_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_updates_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_done_calls_ ABSL_GUARDED_BY(mu_) = 0;

  // The current step: each table sums its part of the admitted pushes as
  // they land, outside mu_; the ledger marks the ranks admitted into it
  // (WorkerProgress::pushed), and landing_ counts those not landed yet.
  int landing_ ABSL_GUARDED_BY(mu_) = 0;
  // The SYNC step's rates: those of its lowest-ranked admitted push
  // (step_rates_rank_; none while no push is admitted), whatever the
  // arrival order.
  std::optional<UpdateRates> step_rates_ ABSL_GUARDED_BY(mu_);
  int step_rates_rank_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<int>::max();

  // Replicas: this process's role and the newest epoch it has seen; the
  // version after each worker's last applied push; per replica, whether
  // it is live, what it acknowledged and what it was sent (-1: nothing;
  // it is sent the state whole); and the updates after log_base_ not yet
  // acknowledged by every live backup. holds_state_: a backup's tables
  // hold a state of its primary's (not part of a failed update's).
  struct Backup {
    bool live = true;
    // Whether it counts in the commit rule. Every backup does from the
    // shard's start and in a job's first office; one that comes back, or
    // every one when a later office begins (BecomePrimary), joins at the
    // first acknowledgement that leaves it fewer than kMaxUnreplicated
    // versions behind, so training goes on while it takes the state whole
    // and the log after it. It leaves only
    // through SetReplicaLive (its office publishes the chain without it
    // first) or with the office.
    bool counts = true;
    int64_t acked = -1;
    int64_t sent = -1;
    // The primary's version when the backup joined the commit rule: until
    // it has acknowledged that, a worker may have been told of an update it
    // lacks, so it is not in the chain (CaughtUpBackups).
    int64_t holds_acknowledged_from = 0;
  };
  static bool CountsInCommitRule(const Backup& backup) { return backup.live && backup.counts; }
  static bool InChain(const Backup& backup) {
    return CountsInCommitRule(backup) && backup.acked >= backup.holds_acknowledged_from;
  }
  std::vector<int> CaughtUpBackupsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins `backup` to the commit rule once it is close enough behind.
  void MaybeJoin(Backup& backup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool primary_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> applied_for_ ABSL_GUARDED_BY(mu_);
  // By worker: registered with this process (not kept in checkpoints). A
  // push claiming a version past the shard's from one that has not is a
  // restart's symptom, not bad input (PushAheadOfARestartedShard).
  std::vector<bool> registered_ ABSL_GUARDED_BY(mu_);
  // By worker, at a backup: the primary's version when the worker's Done,
  // told this replica directly, took effect there (kNotToldDone: none, or
  // it registered since). An update of that version or older was captured
  // before the Done and does not undo it (ApplyReplicaUpdate).
  static constexpr int64_t kNotToldDone = -1;
  std::vector<int64_t> done_told_at_ ABSL_GUARDED_BY(mu_);
  std::vector<Backup> backups_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const ReplicaUpdate>> replica_log_ ABSL_GUARDED_BY(mu_);
  std::optional<std::vector<int>> published_chain_ ABSL_GUARDED_BY(mu_);
  // awaits_first_chain: nothing is acknowledged (Replicated).
  bool first_chain_pending_ ABSL_GUARDED_BY(mu_) = false;
  // The bytes of replica_log_, and of the last state sent whole: a backup
  // catching up is sent a newer state whole once the log it would need
  // outgrows twice that (and kMinCatchUpLogBytes).
  int64_t log_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t whole_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // What Stats reports of the replicas (ReplicationStats' counters).
  ReplicationStats replica_counts_ ABSL_GUARDED_BY(mu_);
  int64_t log_base_ ABSL_GUARDED_BY(mu_) = 0;
  bool holds_state_ ABSL_GUARDED_BY(mu_) = false;

  PushCounters pushes_ ABSL_GUARDED_BY(mu_);
  StreamedStaging staging_ ABSL_GUARDED_BY(mu_);
  // Last: its lease timer's thread reports into the members above, and
  // stops first.
  WorkerLedger ledger_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_PARAMETER_SHARD_H_
