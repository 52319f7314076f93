#include "ps_server/parameter_shard.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "ps_server/model_share.h"
#include "ps_server/rpc_limits.h"
#include "ps_server/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// A push with nothing in it would still count as an update and move the
// version.
bool PushIsEmpty(const PushRequest& push) {
  return push.gradients().empty() && push.rows().empty();
}
absl::Status EmptyPush() {
  return absl::InvalidArgumentError(
      "the push carries no gradients and no embedding rows; nothing was applied");
}

// Whether every value of the push's dense gradients, or of its embedding
// rows, is finite (an unknown dtype counts as not: the tables name it).
bool GradientsFinite(const PushRequest& push) {
  return std::all_of(push.gradients().begin(), push.gradients().end(), [](const Tensor& g) {
    return DTypeBytes(g.dtype()) > 0 && EncodedFinite(g.data(), g.dtype());
  });
}
bool RowsFinite(const PushRequest& push) {
  return std::all_of(push.rows().begin(), push.rows().end(), [](const EmbeddingRows& r) {
    return DTypeBytes(r.dtype()) > 0 && EncodedFinite(r.data(), r.dtype());
  });
}

}  // namespace

ShardOptions ShardOptionsFromConfig(const JobConfig& config, int shard) {
  const TrainingConfig& training = config.training();
  ShardOptions options;
  static_cast<ConsistencyOptions&>(options) = ConsistencyOptionsFromConfig(config);
  if (training.lease_seconds() > 0) {
    options.lease = absl::Seconds(static_cast<double>(training.lease_seconds()));
  }
  options.shard = shard;
  options.num_shards = config.cluster().ps_size();
  options.optimizer = training.optimizer();
  options.seed = training.seed();
  options.model = ConfigModelVariables(config);
  if (!training.checkpoint().dir().empty()) {
    options.snapshot_every_steps = training.checkpoint().every_steps();
  }
  return options;
}

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
      embeddings_(new EmbeddingTable({.shard = options.shard,
                                      .num_shards = options.num_shards,
                                      .num_workers = options.num_workers,
                                      .seed = options.seed,
                                      .optimizer = options.optimizer})),
      dense_(new DenseTable(std::move(optimizer), options.num_workers)),
      progress_(options.num_workers),
      workers_(options.num_workers),
      lease_(
          options.num_workers, options.lease, &mu_,
          [this](const std::vector<int>& workers) {
            mu_.AssertHeld();
            LeasesExpired(workers);
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
  if (worker < 0 || worker >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker index ", worker, " is out of range; this cluster has ", options_.num_workers,
        " worker(s)"));
  }
  return absl::OkStatus();
}

void ParameterShard::Touch(int worker) {
  switch (lease_.Touch(worker)) {
    case LeaseTracker::Heard::kAgain:
      return;
    case LeaseTracker::Heard::kBack:
      progress_[worker].live = true;
      spdlog::info("shard {}: worker:{} is back in the live set", options_.shard, worker);
      break;
    case LeaseTracker::Heard::kFirstTime:
      break;
  }
  WorkersChanged();
  Changed();
}

void ParameterShard::LeasesExpired(const std::vector<int>& workers) {
  for (int worker : workers) {
    progress_[worker].live = false;
    spdlog::warn("shard {}: worker:{} silent for {}; dropped from the live set", options_.shard,
                 worker, absl::FormatDuration(lease_.SinceSeen(worker).value_or(options_.lease)));
  }
  WorkersChanged();
  MaybeCompleteStep();
  Changed();
}

void ParameterShard::WorkersChanged() { ++worker_changes_; }

void ParameterShard::Changed() {
  changed_.SignalAll();
  waiters_.Wake(absl::InfinitePast(), /*all=*/shutting_down_);
}

bool ParameterShard::AllWorkersDone() const {
  return std::all_of(progress_.begin(), progress_.end(),
                     [](const WorkerProgress& w) { return w.done; });
}

bool ParameterShard::PullMayProceed(int worker, int64_t min_version) const {
  return Initialized() && policy_->PullMayProceed(View(), worker, min_version);
}

bool ParameterShard::PullMayProceed(const PullRequest& request) const {
  return PullMayProceed(request.worker(), request.min_version());
}

absl::Status ParameterShard::CheckPull(const PullRequest& request) const {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  if (DTypeBytes(request.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown wire dtype ",
                                                   static_cast<int>(request.dtype()), " in a pull"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::Register(const RegisterRequest& request,
                                      RegisterResponse* response) {
  PST_RETURN_IF_ERROR(CheckWorker(request.worker()));
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  Touch(request.worker());
  if (progress_[request.worker()].done) {
    progress_[request.worker()].done = false;
    WorkersChanged();
    Changed();
  }
  response->set_mode(options_.mode);
  response->set_workers(options_.num_workers);
  response->set_version(version_);
  response->set_initialized(Initialized());
  response->set_shard(options_.shard);
  response->set_num_shards(options_.num_shards);
  response->set_worker_clock(progress_[request.worker()].clock);
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
  PST_RETURN_IF_ERROR(CheckPull(request));
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
  const VariableStore& store = dense_->store();
  std::vector<int> indices;
  if (request.names().empty()) {
    for (size_t i = 0; i < store.size(); ++i) indices.push_back(static_cast<int>(i));
  } else {
    // Each variable once: a request of a few bytes per name must not
    // make the answer many copies of the shard.
    std::vector<bool> seen(store.size(), false);
    for (const std::string& name : request.names()) {
      int index = store.Find(name);
      if (index < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown variable \"", name, "\" in a pull from shard ", options_.shard));
      }
      if (seen[index]) {
        return absl::InvalidArgumentError(
            absl::StrCat("a pull names variable \"", name, "\" twice; name each variable once"));
      }
      seen[index] = true;
      indices.push_back(index);
    }
  }
  PST_RETURN_IF_ERROR(embeddings_->CheckPull(request));
  std::vector<const Variable*> variables;
  for (int index : indices) variables.push_back(&store.variable(index));
  visit(version_, variables, PulledRows(request, *embeddings_));
  return absl::OkStatus();
}

int64_t PulledRows::row_count() const {
  int64_t count = 0;
  for (const EmbeddingRows& rows : request_.rows()) {
    count += static_cast<int64_t>(rows.ids().size() / sizeof(uint64_t));
  }
  return count;
}

int64_t PulledRows::reply_bytes() const {
  int64_t bytes = 0;
  // Per table: the values, the name, and tags, lengths and the dtype (at
  // most 40 bytes).
  for (const EmbeddingRows& rows : request_.rows()) {
    bytes += table_.AnswerBytes(rows, request_.dtype()) +
             static_cast<int64_t>(rows.table().size()) + 40;
  }
  return bytes;
}

void PulledRows::AnswerTo(PullResponse* response) const {
  const DType dtype = request_.dtype() == DTYPE_UNSPECIFIED ? FLOAT32 : request_.dtype();
  for (const EmbeddingRows& rows : request_.rows()) {
    EmbeddingRows* out = response->add_rows();
    out->set_table(rows.table());
    out->set_dtype(dtype);
    std::string* data = out->mutable_data();
    data->resize(static_cast<size_t>(table_.AnswerBytes(rows, dtype)));
    table_.EncodeRows(rows, dtype, data->data());
  }
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
  if (absl::Status s = CheckWorker(request.worker()); !s.ok()) {
    ++pushes_rejected_;
    return s;
  }
  Touch(request.worker());
  if (!Initialized()) {
    ++pushes_rejected_;
    return absl::FailedPreconditionError(
        "push before Init: the variables of this shard have not been initialized yet");
  }
  if (request.computed_at_version() > version_ || request.computed_at_version() < 0) {
    ++pushes_rejected_;
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient claims version ", request.computed_at_version(), " but shard ",
        options_.shard, " is at version ", version_));
  }
  if (PushIsEmpty(request)) {
    ++pushes_rejected_;
    return EmptyPush();
  }
  plans->resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const bool finite =
        tables_[t].get() == embeddings_ ? checked.rows_finite : checked.values_finite;
    if (absl::Status s = tables_[t]->CheckPush(request, policy_->PushCarriesEveryVariable(),
                                               /*check_finite=*/!finite, &(*plans)[t]);
        !s.ok()) {
      ++pushes_rejected_;
      return s;
    }
  }
  absl::StatusOr<Admission> admission =
      policy_->AdmitPush(View(), request.worker(), request.computed_at_version());
  if (!admission.ok()) {
    ++pushes_rejected_;
    return admission.status();
  }
  WorkerState& worker = workers_[request.worker()];
  // A push the update refuses (it would overflow the model) must leave no
  // trace but the rejection counter, the worker's clock included.
  const WorkerState worker_before = worker;
  const int64_t clock_before = progress_[request.worker()].clock;
  const int64_t staleness_sum_before = staleness_sum_;
  RecordPush(request.worker(), request.computed_at_version(),
             version_ - request.computed_at_version());
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
      progress_[request.worker()].pushed = true;
      ++landing_;
      *lands = true;
      return absl::OkStatus();  // TryPush lands it
    case Admission::Action::kApply:
      status = Apply(request, *plans, admission->lr_scale, response);
      break;
  }
  if (!status.ok()) {
    worker = worker_before;
    progress_[request.worker()].clock = clock_before;
    staleness_sum_ = staleness_sum_before;
    return status;
  }
  if (response->outcome() == PushResponse::DROPPED) ++worker.dropped;
  // A new clock can release pulls (SSP's) even when the version did not move.
  Changed();
  return status;
}

void ParameterShard::RecordPush(int worker, int64_t computed_at, int64_t staleness) {
  ++progress_[worker].clock;
  WorkerState& w = workers_[worker];
  w.last_step = computed_at;
  w.last_staleness = staleness;
  w.max_staleness = std::max(w.max_staleness, staleness);
  staleness_sum_ += staleness;
}

absl::StatusOr<ParameterShard::StreamedPush> ParameterShard::BeginStreamedPush(
    const PushRequest& header) {
  absl::MutexLock lock(&mu_);
  auto refuse = [this](absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++pushes_rejected_;
    return status;
  };
  if (absl::Status s = CheckWorker(header.worker()); !s.ok()) return refuse(s);
  if (!Initialized()) {
    return refuse(absl::FailedPreconditionError(
        "push before Init: the variables of this shard have not been initialized yet"));
  }
  if (header.computed_at_version() > version_ || header.computed_at_version() < 0) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("gradient claims version ", header.computed_at_version(), " but shard ",
                     options_.shard, " is at version ", version_)));
  }
  if (PushIsEmpty(header)) return refuse(EmptyPush());
  VariableStore& store = dense_->store();
  StreamedPush push;
  std::vector<int> indices;
  std::vector<bool> seen(store.size(), false);
  for (const Tensor& gradient : header.gradients()) {
    absl::StatusOr<int> index = store.CheckGradientHeader(gradient, &seen);
    if (!index.ok()) return refuse(index.status());
    const Variable& v = store.variable(*index);
    const int element_bytes = DTypeBytes(gradient.dtype());
    if (element_bytes == 0) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat("gradient for \"", gradient.name(), "\" has unknown dtype ",
                       static_cast<int>(gradient.dtype()), "; use FLOAT32, FLOAT16 or BFLOAT16")));
    }
    push.bytes.push_back(static_cast<int64_t>(v.size()) * element_bytes);
    indices.push_back(*index);
  }
  absl::StatusOr<Admission> admission =
      policy_->AdmitPush(View(), header.worker(), header.computed_at_version());
  // Rows are applied by Push only, with the dense part of their push.
  const bool has_rows = !header.rows().empty();
  if (has_rows || !admission.ok() || admission->action != Admission::Action::kApply ||
      staging_held_ || snapshot_unwritten_ || shutting_down_) {
    push.awaits_turn = !has_rows && admission.ok() &&
                       admission->action == Admission::Action::kApply && !shutting_down_;
    return push;  // Push decides, once the gradient is in
  }
  push.update.reset(new StreamedUpdate(this, &dense_->threads(), dense_->parts()));
  StreamedUpdate& update = *push.update;
  update.worker_ = header.worker();
  update.computed_at_ = header.computed_at_version();
  update.staleness_ = version_ - header.computed_at_version();
  update.indices_ = std::move(indices);
  for (int index : update.indices_) {
    absl::StatusOr<VariableStore::StageTarget> target =
        store.BeginStage(index, admission->lr_scale);
    if (!target.ok()) {
      update.holds_staging_ = false;
      return refuse(target.status());
    }
    update.targets_.push_back(*target);
    update.staged_.push_back(store.staged_values(index));
  }
  staging_held_ = true;
  staging_holder_ = push.update.get();
  Touch(header.worker());
  return push;
}

absl::Duration ParameterShard::CancelStalledStream() {
  StreamedUpdate* holder = staging_holder_;
  const absl::Duration idle = holder->Idle();
  if (idle < options_.stalled_stream_timeout || holder->cancelled_) {
    return std::max(options_.stalled_stream_timeout - idle, absl::Milliseconds(10));
  }
  spdlog::warn("shard {}: worker:{}'s push stream sent nothing for {}; cancelling it so that "
               "other updates can go on",
               options_.shard, holder->worker_, absl::FormatDuration(idle));
  holder->cancelled_ = true;
  if (holder->cancel_) {
    holder->cancel_();  // the stream's next read fails and drops the update
  }
  return absl::Milliseconds(10);
}

ParameterShard::WaitId ParameterShard::AwaitUpdateTurnOrWait(absl::AnyInvocable<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (UpdateMayStage()) return 0;
  const absl::Duration recheck =
      snapshot_unwritten_ ? absl::InfiniteDuration() : CancelStalledStream();
  return waiters_.Add(
      {.ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return UpdateMayStage(); },
       .deadline = absl::Now() + recheck,
       .wake = std::move(wake),
       .waiting = &waiting_updates_});
}

absl::Status ParameterShard::CommitStreamedPush(std::unique_ptr<StreamedUpdate> update,
                                                PushResponse* response) {
  absl::MutexLock lock(&mu_);
  // Whatever happens, the staging is free when this returns.
  update->holds_staging_ = false;
  update->staged_.clear();
  ReleaseStagingLocked();
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (update->cancelled_) {
    ++pushes_rejected_;
    return absl::AbortedError(
        "the push stream stalled while other updates waited and was cancelled; nothing of it "
        "was applied");
  }
  Touch(update->worker_);
  for (size_t i = 0; i < update->indices_.size(); ++i) {
    if (absl::Status s = dense_->store().FinishStage(update->indices_[i], update->targets_[i]);
        !s.ok()) {
      DiscardTables();
      ++pushes_rejected_;
      return s;
    }
  }
  RecordPush(update->worker_, update->computed_at_, update->staleness_);
  CommitApplied(response);
  return absl::OkStatus();
}

void ParameterShard::ReleaseStaging() {
  absl::MutexLock lock(&mu_);
  ReleaseStagingLocked();
}

void ParameterShard::ReleaseStagingLocked() {
  staging_held_ = false;
  staging_holder_ = nullptr;
  Changed();  // updates wait for it
}

void ParameterShard::CountRejectedPush() {
  absl::MutexLock lock(&mu_);
  ++pushes_rejected_;
}

ParameterShard::StepResult ParameterShard::MaybeCompleteStep() {
  // An admitted push still landing completes the step itself once it has.
  if (landing_ > 0 || !policy_->StepComplete(View())) return StepResult::kPending;
  absl::Status staged = absl::OkStatus();
  for (const std::unique_ptr<Table>& table : tables_) {
    // Every table's step is emptied, also after a failure.
    if (absl::Status s = table->StageStep(); staged.ok()) staged = s;
  }
  for (WorkerProgress& w : progress_) w.pushed = false;
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
  if (options_.snapshot_every_steps > 0 && version_ % options_.snapshot_every_steps == 0) {
    scheduled_snapshot_ = SnapshotLocked();
    snapshot_unwritten_ = checkpoint_writer_attached_;
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
  if (!progress_[request.worker()].done) {
    progress_[request.worker()].done = true;
    WorkersChanged();
  }
  // A finished worker no longer holds back pulls or steps.
  MaybeCompleteStep();
  Changed();
  int done = 0;
  for (const WorkerProgress& w : progress_) done += w.done ? 1 : 0;
  response->set_workers_done(done);
  return absl::OkStatus();
}

void ParameterShard::Stats(StatsResponse* response) const {
  absl::MutexLock lock(&mu_);
  FillStats(response);
}

namespace {

absl::Status CheckAwaitWorkersDone(const AwaitWorkersDoneRequest& request) {
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AwaitWorkersDone's timeout_ms is ",
                                                   request.timeout_ms(), "; it must be 0 or more"));
  }
  if (request.known_changes() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AwaitWorkersDone's known_changes is ", request.known_changes(),
                     "; pass -1, or the worker_changes of an earlier answer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParameterShard::WaitId> ParameterShard::AwaitWorkersDoneOrWait(
    const AwaitWorkersDoneRequest& request, absl::Time deadline, StatsResponse* response,
    absl::AnyInvocable<void()> wake) {
  PST_RETURN_IF_ERROR(CheckAwaitWorkersDone(request));
  absl::MutexLock lock(&mu_);
  const int64_t known = request.known_changes();
  if (!shutting_down_ && !AllWorkersDone() && worker_changes_ == known && absl::Now() < deadline) {
    return waiters_.Add({.ready = [this, known]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           return AllWorkersDone() || worker_changes_ != known;
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
  int64_t pushes = 0, fastest = 0, slowest = std::numeric_limits<int64_t>::max();
  int done = 0, live = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerState& w = workers_[i];
    const WorkerProgress& p = progress_[i];
    WorkerStats* stats = response->add_workers();
    stats->set_worker(static_cast<int>(i));
    stats->set_last_step(w.last_step);
    stats->set_pushes(p.clock);
    stats->set_clock(p.clock);
    stats->set_last_staleness(w.last_staleness);
    stats->set_max_staleness(w.max_staleness);
    stats->set_done(p.done);
    stats->set_live(p.live);
    stats->set_dropped(w.dropped);
    const std::optional<absl::Duration> since_seen = lease_.SinceSeen(static_cast<int>(i));
    stats->set_seconds_since_seen(since_seen ? absl::ToDoubleSeconds(*since_seen) : -1.0);
    pushes += p.clock;
    done += p.done ? 1 : 0;
    if (p.live) {
      ++live;
      fastest = std::max(fastest, p.clock);
      slowest = std::min(slowest, p.clock);
    }
  }
  response->set_workers_done(done);
  response->set_live_workers(live);
  response->set_clock_spread(live > 0 ? fastest - slowest : 0);
  response->set_mean_staleness(pushes == 0 ? 0.0 : static_cast<double>(staleness_sum_) / pushes);
  *response->mutable_checkpoint() = checkpoint_stats_;
  response->set_worker_changes(worker_changes_);
}

void ParameterShard::SetCheckpointStats(const CheckpointStats& stats) {
  absl::MutexLock lock(&mu_);
  checkpoint_stats_ = stats;
}

ShardCheckpoint ParameterShard::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return SnapshotLocked();
}

void ParameterShard::AttachCheckpointWriter() {
  absl::MutexLock lock(&mu_);
  checkpoint_writer_attached_ = true;
}

void ParameterShard::DetachCheckpointWriter() {
  absl::MutexLock lock(&mu_);
  checkpoint_writer_attached_ = false;
  snapshot_unwritten_ = false;
  Changed();
}

void ParameterShard::ScheduledSnapshotWritten() {
  absl::MutexLock lock(&mu_);
  snapshot_unwritten_ = false;
  Changed();
}

std::optional<ShardCheckpoint> ParameterShard::TakeScheduledSnapshot(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!scheduled_snapshot_ && !shutting_down_) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  std::optional<ShardCheckpoint> snapshot = std::move(scheduled_snapshot_);
  scheduled_snapshot_.reset();
  return snapshot;
}

ShardCheckpoint ParameterShard::SnapshotLocked() const {
  ShardCheckpoint checkpoint;
  checkpoint.set_shard(options_.shard);
  checkpoint.set_version(version_);
  for (const std::unique_ptr<Table>& table : tables_) table->Export(&checkpoint);
  for (const WorkerProgress& w : progress_) checkpoint.add_worker_clocks(w.clock);
  return checkpoint;
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
  for (int i = 0; i < checkpoint.worker_clocks_size() && i < options_.num_workers; ++i) {
    progress_[i].clock = checkpoint.worker_clocks(i);
  }
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
  return lease_.live(worker);
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
