#include "ps_server/parameter_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace pst {

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(
    const ShardOptions& options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError("a parameter server needs at least one worker");
  }
  if (options.mode != SYNC && options.mode != ASYNC) {
    return absl::InvalidArgumentError("the parameter server mode must be SYNC or ASYNC");
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = MakeOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<ParameterShard>(
      new ParameterShard(options, std::move(*optimizer)));
}

ParameterShard::ParameterShard(const ShardOptions& options,
                                 std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      optimizer_name_(optimizer->Name()),
      store_(std::move(optimizer)),
      pending_(options.num_workers),
      arrived_(options.num_workers, false),
      workers_(options.num_workers) {}

absl::Status ParameterShard::CheckWorker(int worker) const {
  if (worker < 0 || worker >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker index ", worker, " is out of range; this cluster has ", options_.num_workers,
        " worker(s)"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::Register(const RegisterRequest& request,
                                       RegisterResponse* response) {
  if (absl::Status s = CheckWorker(request.worker()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  response->set_mode(options_.mode);
  response->set_workers(options_.num_workers);
  response->set_version(version_);
  response->set_initialized(store_.initialized());
  response->set_shard(options_.shard);
  response->set_num_shards(options_.num_shards);
  return absl::OkStatus();
}

absl::Status ParameterShard::Init(const InitRequest& request, InitResponse* response) {
  if (absl::Status s = CheckWorker(request.worker()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  response->set_version(version_);
  if (store_.initialized()) {
    response->set_accepted(false);
    return absl::OkStatus();
  }
  if (absl::Status s = store_.Initialize(request.variables()); !s.ok()) {
    ++pushes_rejected_;
    return s;
  }
  response->set_accepted(true);
  spdlog::info("shard {}: initialized {} variables ({} bytes) from worker:{}", options_.shard,
               store_.size(), store_.parameter_bytes(), request.worker());
  version_changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status ParameterShard::Pull(const PullRequest& request, absl::Time deadline,
                                   PullResponse* response) {
  absl::MutexLock lock(&mu_);
  while (!shutting_down_ && (!store_.initialized() || version_ < request.min_version())) {
    if (version_changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (!store_.initialized()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", options_.shard, " is still waiting for a worker to Init its variables"));
  }
  if (version_ < request.min_version()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "shard ", options_.shard, " is at version ", version_, "; version ",
        request.min_version(), " did not arrive in time (are all workers alive?)"));
  }
  std::vector<int> indices;
  if (request.names().empty()) {
    for (size_t i = 0; i < store_.size(); ++i) indices.push_back(static_cast<int>(i));
  } else {
    for (const std::string& name : request.names()) {
      int index = store_.Find(name);
      if (index < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown variable \"", name, "\" in a pull from shard ", options_.shard));
      }
      indices.push_back(index);
    }
  }
  response->set_version(version_);
  for (int index : indices) {
    const Variable& v = store_.variable(index);
    EncodeTensor(v.name, v.shape, v.values, response->add_variables());
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::Push(const PushRequest& request, PushResponse* response) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (absl::Status s = CheckWorker(request.worker()); !s.ok()) {
    ++pushes_rejected_;
    return s;
  }
  if (!store_.initialized()) {
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
  std::vector<int> indices;
  if (absl::Status s = store_.ValidateGradients(request.gradients(),
                                                /*require_all=*/options_.mode == SYNC, &indices);
      !s.ok()) {
    ++pushes_rejected_;
    return s;
  }
  if (options_.mode == SYNC && request.computed_at_version() == version_ &&
      arrived_[request.worker()]) {
    ++pushes_rejected_;
    return absl::FailedPreconditionError(absl::StrCat(
        "worker:", request.worker(), " already pushed a gradient for version ", version_,
        "; SYNC takes one gradient per worker per step"));
  }
  WorkerState& worker = workers_[request.worker()];
  int64_t staleness = version_ - request.computed_at_version();
  worker.last_step = request.computed_at_version();
  ++worker.pushes;
  worker.last_staleness = staleness;
  worker.max_staleness = std::max(worker.max_staleness, staleness);
  staleness_sum_ += staleness;
  return options_.mode == SYNC ? PushSync(request, indices, response)
                               : PushAsync(request, indices, response);
}

absl::Status ParameterShard::PushSync(const PushRequest& request,
                                       const std::vector<int>& indices,
                                       PushResponse* response) {
  if (request.computed_at_version() < version_) {
    ++pushes_dropped_;
    response->set_outcome(PushResponse::DROPPED);
    response->set_version(version_);
    return absl::OkStatus();
  }
  int rank = request.worker();
  std::vector<std::vector<float>>& slot = pending_[rank];
  slot.resize(store_.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    const Tensor& gradient = request.gradients(static_cast<int>(i));
    slot[indices[i]].resize(store_.variable(indices[i]).values.size());
    DecodeTensor(gradient, slot[indices[i]]);
  }
  arrived_[rank] = true;
  ++arrived_count_;
  if (arrived_count_ < options_.num_workers) {
    ++pushes_aggregated_;
    response->set_outcome(PushResponse::AGGREGATED);
    response->set_version(version_);
    return absl::OkStatus();
  }
  ApplyAggregatedStep();
  ++pushes_applied_;
  response->set_outcome(PushResponse::APPLIED);
  response->set_version(version_);
  return absl::OkStatus();
}

void ParameterShard::ApplyAggregatedStep() {
  const float scale = 1.0f / static_cast<float>(options_.num_workers);
  for (size_t v = 0; v < store_.size(); ++v) {
    sum_.assign(store_.variable(static_cast<int>(v)).values.size(), 0.0f);
    // Rank order, whatever the arrival order: bitwise reproducible sums.
    for (int rank = 0; rank < options_.num_workers; ++rank) {
      const std::vector<float>& g = pending_[rank][v];
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += g[i];
    }
    for (float& x : sum_) x *= scale;
    store_.Apply(static_cast<int>(v), sum_, 1.0f);
  }
  std::fill(arrived_.begin(), arrived_.end(), false);
  arrived_count_ = 0;
  AdvanceVersion();
}

absl::Status ParameterShard::PushAsync(const PushRequest& request,
                                        const std::vector<int>& indices,
                                        PushResponse* response) {
  std::vector<float> scratch;
  for (size_t i = 0; i < indices.size(); ++i) {
    store_.Apply(indices[i], TensorValues(request.gradients(static_cast<int>(i)), &scratch),
                 1.0f);
  }
  ++pushes_applied_;
  AdvanceVersion();
  response->set_outcome(PushResponse::APPLIED);
  response->set_version(version_);
  return absl::OkStatus();
}

void ParameterShard::AdvanceVersion() {
  ++version_;
  version_changed_.SignalAll();
}

absl::Status ParameterShard::Done(const DoneRequest& request, DoneResponse* response) {
  if (absl::Status s = CheckWorker(request.worker()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  workers_[request.worker()].done = true;
  int done = 0;
  for (const WorkerState& w : workers_) done += w.done ? 1 : 0;
  response->set_workers_done(done);
  return absl::OkStatus();
}

void ParameterShard::Stats(StatsResponse* response) {
  absl::MutexLock lock(&mu_);
  response->set_version(version_);
  response->set_pushes_applied(pushes_applied_);
  response->set_pushes_aggregated(pushes_aggregated_);
  response->set_pushes_dropped(pushes_dropped_);
  response->set_pushes_rejected(pushes_rejected_);
  response->set_variables(static_cast<int>(store_.size()));
  response->set_parameter_bytes(store_.parameter_bytes());
  response->set_mode(options_.mode);
  int64_t pushes = 0;
  int done = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const WorkerState& w = workers_[i];
    WorkerStats* stats = response->add_workers();
    stats->set_worker(static_cast<int>(i));
    stats->set_last_step(w.last_step);
    stats->set_pushes(w.pushes);
    stats->set_last_staleness(w.last_staleness);
    stats->set_max_staleness(w.max_staleness);
    stats->set_done(w.done);
    pushes += w.pushes;
    done += w.done ? 1 : 0;
  }
  response->set_workers_done(done);
  response->set_mean_staleness(pushes == 0 ? 0.0 : static_cast<double>(staleness_sum_) / pushes);
}

void ParameterShard::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  version_changed_.SignalAll();
}

}  // namespace pst
