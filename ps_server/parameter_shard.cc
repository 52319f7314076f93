#include "ps_server/parameter_shard.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps_server/model_share.h"
#include "ps_server/shard_requests.h"
#include "ps_server/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst {
absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(
    const ShardOptions& options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError("a parameter server needs at least one worker");
  }
  if (options.model && (options.shard < 0 || options.shard >= options.num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options.shard, " is not one of the ", options.num_shards, " shards"));
  }
  absl::StatusOr<std::unique_ptr<ConsistencyPolicy>> policy = MakeConsistencyPolicy(options);
  if (!policy.ok()) return policy.status();
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = MakeOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<ParameterShard>(
      new ParameterShard(options, std::move(*policy), std::move(*optimizer)));
}

ParameterShard::ParameterShard(const ShardOptions& options,
                               std::unique_ptr<ConsistencyPolicy> policy,
                               std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      model_share_(options.model ? std::optional(ShardShare(*options.model, options.shard,
                                                            options.num_shards))
                                 : std::nullopt),
      policy_(std::move(policy)),
      optimizer_name_(optimizer->Name()),
      snapshots_(options.snapshot_every_steps, &mu_),
      embeddings_(new EmbeddingTable({.shard = options.shard,
                                      .num_shards = options.num_shards,
                                      .num_workers = options.num_workers,
                                      .seed = options.seed,
                                      .optimizer = options.optimizer})),
      dense_(new DenseTable(std::move(optimizer), options.num_workers)),
      ledger_(
          options.num_workers, options.shard, options.lease, &mu_,
          [this] {
            mu_.AssertHeld();
            WorkersLeft();
          },
          options.lease_clock != nullptr ? *options.lease_clock : SystemLeaseClock()) {
  tables_.push_back(std::unique_ptr<Table>(embeddings_));
  tables_.push_back(std::unique_ptr<Table>(dense_));
}

ParameterShard::~ParameterShard() { waiters_.Stop(); }

bool ParameterShard::CancelWait(WaitId id) {
  absl::MutexLock lock(&mu_);
  return waiters_.Cancel(id);
}

absl::Status ParameterShard::CheckWorker(int worker) const {
  return CheckWorkerIndex(worker, options_.num_workers);
}

void ParameterShard::Touch(int worker) {
  if (ledger_.Heard(worker)) Changed();
}

void ParameterShard::WorkersLeft() {
  MaybeCompleteStep();
  Changed();
}

void ParameterShard::Changed() {
  snapshots_.Wake();
  waiters_.Wake(absl::InfinitePast(), /*all=*/shutting_down_);
}

bool ParameterShard::PullMayProceed(int worker, int64_t min_version) const {
  return Initialized() && policy_->PullMayProceed(View(), worker, min_version);
}

bool ParameterShard::PullMayProceed(const PullRequest& request) const {
  return PullMayProceed(request.worker(), request.min_version());
}

absl::Status ParameterShard::Register(const RegisterRequest& request,
                                      RegisterResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  Touch(request.worker());
  if (ledger_.Rejoin(request.worker())) Changed();
  response->set_mode(options_.mode);
  response->set_workers(options_.num_workers);
  response->set_version(version_);
  response->set_initialized(Initialized());
  response->set_shard(options_.shard);
  response->set_num_shards(options_.num_shards);
  response->set_worker_clock(ledger_.clock(request.worker()));
  return absl::OkStatus();
}

absl::Status ParameterShard::Init(const InitRequest& request, InitResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  Touch(request.worker());
  response->set_version(version_);
  if (Initialized()) {
    response->set_accepted(false);
    return absl::OkStatus();
  }
  if (model_share_) {
    if (absl::Status s = CheckInitIsShare(request, *model_share_, options_.shard); !s.ok()) {
      ++pushes_rejected_;
      return s;
    }
  }
  // A table that took its contents before a later one refused them takes
  // the next Init's instead: the shard is not initialized until every
  // table is, and nothing is staged before.
  for (const std::unique_ptr<Table>& table : tables_) {
    if (absl::Status s = table->Initialize(request); !s.ok()) {
      ++pushes_rejected_;
      return s;
    }
  }
  dense_bytes_ = dense_->parameter_bytes();
  RefreshParameterBytes();
  response->set_accepted(true);
  spdlog::info("shard {}: initialized {} variables ({} bytes) and {} embedding tables from "
               "worker:{}",
               options_.shard, dense_->store().size(), parameter_bytes(),
               request.embeddings_size(), request.worker());
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<ParameterShard::WaitId> ParameterShard::PullVisitOrWait(
    const PullRequest& request, absl::Time deadline, const PullVisitor& visit,
    absl::AnyInvocable<void()> wake) {
  PST_RETURN_IF_ERROR(CheckPullFields(request, options_.num_workers));
  absl::MutexLock lock(&mu_);
  Touch(request.worker());
  if (!shutting_down_ && !PullMayProceed(request) && absl::Now() < deadline) {
    return waiters_.Add({.ready = [this, worker = request.worker(),
                                   min_version = request.min_version()]()
                                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                        return PullMayProceed(worker, min_version);
                                      },
                         .deadline = deadline,
                         .wake = std::move(wake),
                         .worker = request.worker(),
                         .waiting = &waiting_pulls_});
  }
  PST_RETURN_IF_ERROR(VisitLocked(request, visit));
  return WaitId{0};
}

absl::Status ParameterShard::VisitLocked(const PullRequest& request, const PullVisitor& visit) {
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (!Initialized()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", options_.shard, " is still waiting for a worker to Init its variables"));
  }
  if (version_ < request.min_version()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", options_.shard, " is at version ", version_, "; version ",
        request.min_version(), " did not arrive in time (are all workers alive?)"));
  }
  if (!PullMayProceed(request)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "worker:", request.worker(), " is more than ", options_.staleness,
        " steps ahead of the slowest live worker and it did not catch up in time"));
  }
  PST_ASSIGN_OR_RETURN(std::vector<const Variable*> variables,
                       dense_->Select(request, options_.shard));
  PST_RETURN_IF_ERROR(embeddings_->CheckPull(request));
  visit(version_, variables, PulledRows(request, *embeddings_));
  return absl::OkStatus();
}

std::optional<absl::Status> ParameterShard::TryPush(const PushRequest& request,
                                                    PushResponse* response, PushChecked checked) {
  // The pass over the payload needs nothing of the shard: made before the
  // lock, so pushes check their bytes side by side. A non-finite value is
  // left to the table's CheckPush, which names it.
  if (!checked.values_finite) checked.values_finite = GradientsFinite(request);
  if (!checked.rows_finite) checked.rows_finite = RowsFinite(request);
  std::vector<TablePush> plans;
  bool lands = false;
  {
    absl::MutexLock lock(&mu_);
    std::optional<absl::Status> decided = DecidePush(request, checked, response, &plans, &lands);
    if (!lands) return decided;
  }
  // Admitted into the step, whose sums guard themselves: landed outside the
  // lock, so that pushes of several ranks sum side by side. The tables are
  // fixed at construction.
  const std::vector<std::unique_ptr<Table>>& tables = ABSL_TS_UNCHECKED_READ(tables_);
  for (size_t t = 0; t < tables.size(); ++t) tables[t]->Land(request.worker(), request, plans[t]);
  absl::MutexLock lock(&mu_);
  --landing_;
  switch (MaybeCompleteStep()) {
    case StepResult::kPending:
      ++pushes_aggregated_;
      response->set_outcome(PushResponse::AGGREGATED);
      break;
    case StepResult::kApplied:
      response->set_outcome(PushResponse::APPLIED);
      break;
    case StepResult::kSkipped:
      response->set_outcome(PushResponse::SKIPPED);
      break;
  }
  response->set_version(version_);
  Changed();
  return absl::OkStatus();
}

std::optional<absl::Status> ParameterShard::DecidePush(const PushRequest& request,
                                                       PushChecked checked,
                                                       PushResponse* response,
                                                       std::vector<TablePush>* plans,
                                                       bool* lands) {
  if (!UpdateMayStage()) return std::nullopt;
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (absl::Status s = CheckWorker(request.worker()); !s.ok()) return Refuse(s);
  Touch(request.worker());
  if (!Initialized()) return Refuse(PushBeforeInit());
  if (absl::Status s = CheckPushClaims(request, options_.shard, version_); !s.ok()) {
    return Refuse(s);
  }
  plans->resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const bool finite =
        tables_[t].get() == embeddings_ ? checked.rows_finite : checked.values_finite;
    if (absl::Status s = tables_[t]->CheckPush(request, policy_->PushCarriesEveryVariable(),
                                               /*check_finite=*/!finite, &(*plans)[t]);
        !s.ok()) {
      return Refuse(s);
    }
  }
  absl::StatusOr<Admission> admission =
      policy_->AdmitPush(View(), request.worker(), request.computed_at_version());
  if (!admission.ok()) return Refuse(admission.status());
  // A push the update refuses (it would overflow the model) must leave no
  // trace but the rejection counter, the worker's clock included.
  const WorkerLedger::Mark before = ledger_.RecordPush(
      request.worker(), request.computed_at_version(), version_ - request.computed_at_version());
  absl::Status status = absl::OkStatus();
  switch (admission->action) {
    case Admission::Action::kDrop:
      ++pushes_dropped_;
      response->set_outcome(PushResponse::DROPPED);
      response->set_version(version_);
      break;
    case Admission::Action::kAggregate:
      // The step cannot complete before this push has landed, and no other
      // push of this rank is admitted until it completes.
      ledger_.Admit(request.worker());
      ++landing_;
      *lands = true;
      return absl::OkStatus();  // TryPush lands it
    case Admission::Action::kApply:
      status = Apply(request, *plans, admission->lr_scale, response);
      break;
  }
  if (!status.ok()) {
    ledger_.Undo(before);
    return status;
  }
  if (response->outcome() == PushResponse::DROPPED) ledger_.CountDropped(request.worker());
  // A new clock can release pulls (SSP's) even when the version did not move.
  Changed();
  return status;
}

ParameterShard::StepResult ParameterShard::MaybeCompleteStep() {
  // An admitted push still landing completes the step itself once it has.
  if (landing_ > 0 || !policy_->StepComplete(View())) return StepResult::kPending;
  absl::Status staged = absl::OkStatus();
  for (const std::unique_ptr<Table>& table : tables_) {
    // Every table's step is emptied, also after a failure.
    if (absl::Status s = table->StageStep(); staged.ok()) staged = s;
  }
  ledger_.StepCompleted();
  // pushes_applied counts completed steps, so it stays equal to the version.
  ++pushes_applied_;
  if (staged.ok()) {
    CommitTables();
  } else {
    // The workers wait for the next version whatever happens, so the step
    // still completes; the model just keeps its values, and the refused
    // update is counted as rejected too.
    DiscardTables();
    ++pushes_rejected_;
    spdlog::warn("shard {}: SYNC step at version {} skipped: {}", options_.shard, version_,
                 std::string(staged.message()));
  }
  AdvanceVersion();
  return staged.ok() ? StepResult::kApplied : StepResult::kSkipped;
}

absl::Status ParameterShard::Apply(const PushRequest& request,
                                   const std::vector<TablePush>& plans, float lr_scale,
                                   PushResponse* response) {
  response->set_version(version_);
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (absl::Status staged = tables_[t]->Stage(request, plans[t], lr_scale); !staged.ok()) {
      DiscardTables();
      ++pushes_rejected_;
      return staged;
    }
  }
  CommitApplied(response);
  return absl::OkStatus();
}

bool ParameterShard::Initialized() const {
  return std::all_of(tables_.begin(), tables_.end(),
                     [](const std::unique_ptr<Table>& table) { return table->initialized(); });
}

void ParameterShard::CommitTables() {
  for (const std::unique_ptr<Table>& table : tables_) table->Commit();
  RefreshParameterBytes();
}

void ParameterShard::RefreshParameterBytes() {
  parameter_bytes_.store(dense_bytes_ + embeddings_->parameter_bytes(), std::memory_order_relaxed);
}

void ParameterShard::DiscardTables() {
  for (const std::unique_ptr<Table>& table : tables_) table->Discard();
}

void ParameterShard::CommitApplied(PushResponse* response) {
  CommitTables();
  ++pushes_applied_;
  AdvanceVersion();
  response->set_outcome(PushResponse::APPLIED);
  response->set_version(version_);
}

void ParameterShard::AdvanceVersion() {
  ++version_;
  if (snapshots_.Due(version_)) snapshots_.Schedule(SnapshotLocked());
  Changed();
}

absl::Status ParameterShard::Heartbeat(const HeartbeatRequest& request,
                                       HeartbeatResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  Touch(request.worker());
  response->set_version(version_);
  return absl::OkStatus();
}

absl::Status ParameterShard::Done(const DoneRequest& request, DoneResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  Touch(request.worker());
  ledger_.Finish(request.worker());
  // A finished worker no longer holds back pulls or steps.
  MaybeCompleteStep();
  Changed();
  response->set_workers_done(ledger_.done_count());
  return absl::OkStatus();
}

void ParameterShard::Stats(StatsResponse* response) const {
  absl::MutexLock lock(&mu_);
  FillStats(response);
}

absl::StatusOr<ParameterShard::WaitId> ParameterShard::AwaitWorkersDoneOrWait(
    const AwaitWorkersDoneRequest& request, absl::Time deadline, StatsResponse* response,
    absl::AnyInvocable<void()> wake) {
  PST_RETURN_IF_ERROR(CheckAwaitWorkersDone(request));
  absl::MutexLock lock(&mu_);
  const int64_t known = request.known_changes();
  if (!shutting_down_ && !ledger_.AllDone() && ledger_.changes() == known &&
      absl::Now() < deadline) {
    return waiters_.Add({.ready = [this, known]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           return ledger_.AllDone() || ledger_.changes() != known;
                         },
                         .deadline = deadline,
                         .wake = std::move(wake),
                         .waiting = &waiting_done_calls_});
  }
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  FillStats(response);
  return WaitId{0};
}

void ParameterShard::FillStats(StatsResponse* response) const {
  response->set_version(version_);
  response->set_pushes_applied(pushes_applied_);
  response->set_pushes_aggregated(pushes_aggregated_);
  response->set_pushes_dropped(pushes_dropped_);
  response->set_pushes_rejected(pushes_rejected_);
  for (const std::unique_ptr<Table>& table : tables_) table->AddStats(response);
  response->set_mode(options_.mode);
  ledger_.FillStats(response);
  *response->mutable_checkpoint() = snapshots_.stats();
}

void ParameterShard::SetCheckpointStats(const CheckpointStats& stats) {
  absl::MutexLock lock(&mu_);
  snapshots_.set_stats(stats);
}

ShardCheckpoint ParameterShard::Snapshot() const {
  ShardSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = SnapshotLocked();
  }
  return std::move(snapshot).Finish();  // the tables' views, outside the lock
}

void ParameterShard::AttachCheckpointWriter() {
  absl::MutexLock lock(&mu_);
  snapshots_.AttachWriter();
}

void ParameterShard::DetachCheckpointWriter() {
  absl::MutexLock lock(&mu_);
  snapshots_.DetachWriter();
  Changed();
}

void ParameterShard::ScheduledSnapshotWritten() {
  absl::MutexLock lock(&mu_);
  snapshots_.Written();
  Changed();
}

std::optional<ShardCheckpoint> ParameterShard::TakeScheduledSnapshot(absl::Time deadline) {
  std::optional<ShardSnapshot> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = snapshots_.Take(deadline, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return shutting_down_;  // read with mu_ held: Take waits on it
    });
  }
  if (!snapshot) return std::nullopt;
  return std::move(*snapshot).Finish();
}

ShardSnapshot ParameterShard::SnapshotLocked() const {
  ShardSnapshot snapshot;
  snapshot.checkpoint.set_shard(options_.shard);
  snapshot.checkpoint.set_version(version_);
  for (const std::unique_ptr<Table>& table : tables_) table->Capture(&snapshot);
  ledger_.ExportClocks(&snapshot.checkpoint);
  return snapshot;
}

absl::Status ParameterShard::Restore(const ShardCheckpoint& checkpoint) {
  absl::MutexLock lock(&mu_);
  if (Initialized()) {
    return absl::FailedPreconditionError("the shard already holds variables; restore only at start");
  }
  if (checkpoint.shard() != options_.shard) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint is of shard ", checkpoint.shard(),
                                                   ", this is shard ", options_.shard));
  }
  for (const std::unique_ptr<Table>& table : tables_) {
    PST_RETURN_IF_ERROR(table->Restore(checkpoint));
  }
  dense_bytes_ = dense_->parameter_bytes();
  RefreshParameterBytes();
  version_ = checkpoint.version();
  ledger_.RestoreClocks(checkpoint);
  Changed();
  return absl::OkStatus();
}

int64_t ParameterShard::parameter_bytes() const {
  return parameter_bytes_.load(std::memory_order_relaxed);
}

bool ParameterShard::initialized() const {
  absl::MutexLock lock(&mu_);
  return Initialized();
}

int64_t ParameterShard::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

bool ParameterShard::WorkerLive(int worker) const {
  absl::MutexLock lock(&mu_);
  return ledger_.live(worker);
}

int ParameterShard::waiting_pulls() const {
  absl::MutexLock lock(&mu_);
  return waiting_pulls_;
}

int ParameterShard::waiting_updates() const {
  absl::MutexLock lock(&mu_);
  return waiting_updates_;
}

int ParameterShard::waiting_done_calls() const {
  absl::MutexLock lock(&mu_);
  return waiting_done_calls_;
}

bool ParameterShard::streamed_update_staged() const {
  absl::MutexLock lock(&mu_);
  return staging_held_;
}

void ParameterShard::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  Changed();
}

}  // namespace pst
