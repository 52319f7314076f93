#include "ps_server/core/parameter_shard.h"

#include "common/status_macros.h"
#include "ps_server/core/shard_requests.h"
#include "ps_server/core/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst {

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(
    const ShardOptions& options) {
  PST_RETURN_IF_ERROR(CheckShardOptions(options));
  PST_ASSIGN_OR_RETURN(std::unique_ptr<ConsistencyPolicy> policy, MakeConsistencyPolicy(options));
  PST_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer, MakeOptimizer(options.optimizer));
  return std::unique_ptr<ParameterShard>(
      new ParameterShard(options, std::move(policy), std::move(optimizer)));
}

ParameterShard::ParameterShard(const ShardOptions& options,
                               std::unique_ptr<ConsistencyPolicy> policy,
                               std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      policy_(std::move(policy)),
      optimizer_name_(optimizer->Name()),
      snapshots_(options.snapshot_every_steps, &mu_),
      tables_(options, std::move(optimizer)),
      primary_(options.replica == 0 && !options.elected),
      applied_for_(options.num_workers, 0),
      registered_(options.num_workers, false),
      done_told_at_(options.num_workers, kNotToldDone),
      backups_(options.replicas),
      ledger_(
          options.num_workers, options.shard, options.lease, &mu_,
          [this] {
            mu_.AssertHeld();
            WorkersLeft();
          },
          options.lease_clock != nullptr ? *options.lease_clock : SystemLeaseClock()) {}

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
  if (!primary_) return true;  // VisitLocked refuses it: the primary answers
  return tables_.initialized() && policy_->PullMayProceed(View(), worker, min_version) &&
         Replicated(worker, min_version);
}

absl::Status ParameterShard::Register(const RegisterRequest& request,
                                      RegisterResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  PST_RETURN_IF_ERROR(CheckPrimary());
  Touch(request.worker());
  registered_[request.worker()] = true;
  done_told_at_[request.worker()] = kNotToldDone;
  if (ledger_.Rejoin(request.worker())) Changed();
  response->set_mode(options_.mode);
  response->set_workers(options_.num_workers);
  response->set_version(version_);
  response->set_initialized(tables_.initialized());
  response->set_shard(options_.shard);
  response->set_num_shards(options_.num_shards);
  response->set_worker_clock(ledger_.clock(request.worker()));
  response->set_epoch(epoch_);
  return absl::OkStatus();
}

absl::Status ParameterShard::Init(const InitRequest& request, InitResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  Touch(request.worker());
  response->set_version(version_);
  PST_RETURN_IF_ERROR(CheckPrimary());
  if (tables_.initialized()) {
    response->set_accepted(false);
    return absl::OkStatus();
  }
  if (absl::Status s = tables_.Initialize(request); !s.ok()) return Refuse(s);
  reads_ahead_.store(tables_.embeddings().ReadsAhead());
  RestartForwarding();
  response->set_accepted(true);
  Changed();
  return absl::OkStatus();
}

int64_t ParameterShard::RowsAnswerBytes(const PullRequest& pull) const {
  absl::MutexLock lock(&mu_);
  return PulledRows(pull, tables_.embeddings()).reply_bytes();
}

void ParameterShard::PrefetchRows(const PullRequest& pull) const {
  if (!reads_ahead_.load()) return;
  absl::MutexLock lock(&mu_);
  tables_.embeddings().Prefetch(pull);
}

absl::StatusOr<ParameterShard::WaitId> ParameterShard::PullVisitOrWait(
    const PullRequest& request, absl::Time deadline, const PullVisitor& visit,
    absl::AnyInvocable<void()> wake) {
  PST_RETURN_IF_ERROR(CheckPullFields(request, options_.num_workers));
  absl::MutexLock lock(&mu_);
  Touch(request.worker());
  if (!shutting_down_ && !PullMayProceed(request.worker(), request.min_version()) &&
      absl::Now() < deadline) {
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
  PST_RETURN_IF_ERROR(CheckPrimary());
  if (!PullMayProceed(request.worker(), request.min_version())) {
    return PullTimedOut(request, options_.shard, tables_.initialized(), version_,
                        options_.staleness);
  }
  PST_ASSIGN_OR_RETURN(std::vector<const Variable*> variables,
                       tables_.dense().Select(request, options_.shard));
  PST_RETURN_IF_ERROR(tables_.embeddings().CheckPull(request));
  visit(version_, variables, PulledRows(request, tables_.embeddings()));
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
  // lock, so that pushes of several ranks sum side by side.
  ABSL_TS_UNCHECKED_READ(tables_).Land(request.worker(), request, plans);
  absl::MutexLock lock(&mu_);
  --landing_;
  const PushResponse::Outcome outcome = MaybeCompleteStep();
  if (outcome == PushResponse::AGGREGATED) ++pushes_.aggregated;
  response->set_outcome(outcome);
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
  if (absl::Status s = CheckPrimary(); !s.ok()) return Refuse(s);
  Touch(request.worker());
  if (!tables_.initialized()) return Refuse(PushBeforeInit());
  if (absl::Status s = CheckClaims(request); !s.ok()) {
    return Refuse(s);
  }
  if (RepeatedPush(request)) {
    ++pushes_.repeated;
    response->set_outcome(PushResponse::DUPLICATE);
    response->set_version(RepeatTakesEffectAt(request.worker()));
    return absl::OkStatus();
  }
  if (absl::Status s =
          tables_.CheckPush(request, policy_->PushCarriesEveryVariable(), checked, plans);
      !s.ok()) {
    return Refuse(s);
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
      ++pushes_.dropped;
      response->set_outcome(PushResponse::DROPPED);
      response->set_version(version_);
      break;
    case Admission::Action::kAggregate:
      // The step cannot complete before this push has landed, and no other
      // push of this rank is admitted until it completes.
      ledger_.Admit(request.worker());
      if (request.worker() < step_rates_rank_) {
        step_rates_rank_ = request.worker();
        step_rates_ = request.has_rates() ? std::optional(request.rates()) : std::nullopt;
      }
      ++landing_;
      *lands = true;
      return absl::OkStatus();  // TryPush lands it
    case Admission::Action::kApply:
      response->set_version(version_);
      if (!PushCarriesAnUpdate(request)) {
        // No update: neither the version (which everyone's staleness and
        // the checkpoint interval count) nor the model moves.
        response->set_outcome(PushResponse::UNCHANGED);
        break;
      }
      status = tables_.Stage(
          request, *plans,
          UpdateSettings(admission->lr_scale, request.has_rates() ? &request.rates() : nullptr),
          ClipNorm(request.has_rates() ? &request.rates() : nullptr,
                   options_.optimizer.clip_norm()));
      if (status.ok()) {
        CommitApplied(request.worker(), response);
      } else {
        ++pushes_.rejected;
      }
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

PushResponse::Outcome ParameterShard::MaybeCompleteStep() {
  // An admitted push still landing completes the step itself once it has.
  if (landing_ > 0 || !policy_->StepComplete(View())) return PushResponse::AGGREGATED;
  const UpdateRates* rates = step_rates_.has_value() ? &*step_rates_ : nullptr;
  return CompleteStep(tables_.StageStep(UpdateSettings(1.0f, rates),
                                        ClipNorm(rates, options_.optimizer.clip_norm())));
}

absl::Status ParameterShard::CheckClaims(const PushRequest& push) const {
  if (push.computed_at_version() > version_ && !registered_[push.worker()]) {
    return PushAheadOfARestartedShard(options_.shard, push.computed_at_version(), version_);
  }
  return CheckPushClaims(push, options_.shard, version_);
}

int64_t ParameterShard::RepeatTakesEffectAt(int worker) const {
  if (View().workers[worker].pushed) return version_ + 1;  // its step waits for others
  // Unknown (0) where another replica, or another life of this one, took it.
  const int64_t applied = applied_for_[worker];
  return applied > 0 ? std::min(applied, version_) : version_;
}

PushResponse::Outcome ParameterShard::CompleteStep(const absl::Status& staged) {
  // Each gradient of the step takes effect at the version the step makes.
  const ShardView view = View();
  for (size_t w = 0; w < view.workers.size(); ++w) {
    if (view.workers[w].pushed) applied_for_[w] = version_ + 1;
  }
  ledger_.StepCompleted();
  step_rates_.reset();
  step_rates_rank_ = std::numeric_limits<int>::max();
  ++pushes_.applied;
  if (staged.ok()) {
    tables_.Commit();
  } else {
    // The workers wait for the next version whatever happens, so the step
    // still completes; the model just keeps its values, and the refused
    // update is counted as rejected too.
    tables_.Discard();
    ++pushes_.rejected;
    spdlog::warn("shard {}: SYNC step at version {} skipped: {}", options_.shard, version_,
                 std::string(staged.message()));
  }
  AdvanceVersion();
  return staged.ok() ? PushResponse::APPLIED : PushResponse::SKIPPED;
}

void ParameterShard::CommitApplied(int worker, PushResponse* response) {
  tables_.Commit();
  ++pushes_.applied;
  AdvanceVersion();
  applied_for_[worker] = version_;
  response->set_outcome(PushResponse::APPLIED);
  response->set_version(version_);
}

void ParameterShard::AdvanceVersion() {
  ++version_;
  if (Forwards()) ForwardVersion();
  // A link of the checkpoint chain only while a writer takes it: a delta
  // over a snapshot no one wrote would not restore.
  if (snapshots_.Due(version_)) {
    snapshots_.Schedule(snapshots_.writer_attached() ? ChainSnapshotLocked() : SnapshotLocked());
  }
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
  if (!primary_) {
    // Without the primary's version (it did not answer), this replica's
    // own: every update it applies later is newer, and says.
    done_told_at_[request.worker()] =
        request.has_primary_version() ? request.primary_version() : version_;
  }
  // A finished worker no longer holds back pulls or steps.
  MaybeCompleteStep();
  Changed();
  response->set_workers_done(ledger_.done_count());
  response->set_version(version_);
  response->set_primary(primary_);
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
  pushes_.AddStats(response);
  tables_.AddStats(response);
  response->set_mode(options_.mode);
  ledger_.FillStats(response);
  *response->mutable_checkpoint() = snapshots_.stats();
  response->mutable_checkpoint()->set_capture_micros(absl::ToInt64Microseconds(last_capture_));
  if (options_.replicas > 1) FillReplicationStats(response->mutable_replication());
}

int64_t ParameterShard::parameter_bytes() const {
  return ABSL_TS_UNCHECKED_READ(tables_).parameter_bytes();  // an atomic
}

bool ParameterShard::initialized() const {
  absl::MutexLock lock(&mu_);
  return tables_.initialized();
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
  return staging_.held();
}

void ParameterShard::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  Changed();
}

}  // namespace pst
