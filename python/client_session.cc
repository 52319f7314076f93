#include "python/client_session.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "python/worker_telemetry.h"
#include "spdlog/spdlog.h"
#include "worker/client/worker_metrics.h"

namespace pst {

namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The variables' sizes checked before anything is allocated for them: a
// negative or zero dimension, or a product past the limit, is a mistake
// that VariableSpec::size would wrap or miscount.
absl::Status CheckModelSize(const std::vector<VariableSpec>& variables) {
  constexpr absl::string_view kLimit = " (1 GiB of float32) a worker or PS holds";
  int64_t total = 0;
  for (const VariableSpec& v : variables) {
    int64_t size = 1;
    for (int64_t d : v.shape) {
      if (d < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", v.name, "\" has shape ", ShapeText(v.shape),
                         ": a dimension must be at least 1"));
      }
      // size is at most the limit + 1 and d at most the limit: no overflow.
      size = d > kMaxModelParameters ? kMaxModelParameters + 1
                                     : std::min(size * d, kMaxModelParameters + 1);
    }
    if (size > kMaxModelParameters) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable \"", v.name, "\" has shape ", ShapeText(v.shape),
                       ": more than the ", kMaxModelParameters, " parameters", kLimit,
                       "; declare a smaller model"));
    }
    total += size;
    if (total > kMaxModelParameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model's variables up to \"", v.name, "\" hold ", total,
          " parameters, more than the ", kMaxModelParameters, kLimit, "; declare a smaller model"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientSession>> ClientSession::Open(
    const std::string& config_path, const std::string& task_text,
    absl::Duration connect_timeout) {
  PST_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(config_path, ConfigOverrides()));
  PST_ASSIGN_OR_RETURN(TaskId task, ParseTask(task_text));
  if (task.kind != TaskId::Kind::kWorker) {
    return absl::InvalidArgumentError(
        absl::StrCat("task \"", task_text, "\" is not a worker; use worker:<index>"));
  }
  PST_RETURN_IF_ERROR(ValidateTask(config, task));
  NameWorkerProcess(task.index);
  PST_ASSIGN_OR_RETURN(std::unique_ptr<ConsistencyPolicy> policy,
                       MakeConsistencyPolicy(ConsistencyOptionsFromConfig(config)));
  PST_ASSIGN_OR_RETURN(ClusterSecurity security,
                       ClusterSecurity::FromConfig(config.cluster(),
                                                   ClusterSecurity::Role::kClient));
  for (const std::string& warning : security.warnings()) spdlog::warn("{}", warning);
  std::vector<std::string> addresses(config.cluster().ps().begin(), config.cluster().ps().end());
  PST_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(addresses, task.index, connect_timeout, security));
  client->set_wire_dtype(WireDType(config.training().wire_dtype()));
  client->set_call_patience(absl::Seconds(config.training().pull_timeout_seconds()));
  client->set_transport(config.cluster().shm() == SHM_OFF ? PsClient::Transport::kTcp
                                                          : PsClient::Transport::kAuto);
  const auto& tables = config.training().model().embeddings();
  client->SetEmbeddingTables({tables.begin(), tables.end()});
  return std::unique_ptr<ClientSession>(
      new ClientSession(std::move(config), std::move(client), std::move(policy)));
}

ClientSession::ClientSession(JobConfig config, std::unique_ptr<PsClient> client,
                             std::unique_ptr<const ConsistencyPolicy> policy)
    : config_(std::move(config)),
      client_(std::move(client)),
      policy_(std::move(policy)),
      versions_(client_->num_shards(), 0),
      next_min_(client_->num_shards(), 0) {}

ClientSession::~ClientSession() {
  absl::MutexLock lock(&mu_);
  StopHeartbeats();
}

absl::Duration ClientSession::pull_timeout() const {
  return absl::Seconds(config_.training().pull_timeout_seconds());
}

bool ClientSession::uses_shared_memory(int shard) const {
  absl::MutexLock lock(&mu_);
  return client_->uses_shared_memory(shard);
}

absl::Status ClientSession::CheckNotEnded(const char* call) const {
  if (!ended_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(call, " after done(): the session has ended; make a new Client to train "
                         "again (after done() a session only pulls)"));
}

absl::StatusOr<RegisterResponse> ClientSession::Register() {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("register"));
  return RegisterLocked();
}

absl::StatusOr<RegisterResponse> ClientSession::RegisterLocked() {
  PST_ASSIGN_OR_RETURN(RegisterResponse view, client_->Register());
  const TrainingConfig& training = config_.training();
  if (view.mode() != training.mode() || view.workers() != config_.cluster().workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:0 runs ", ModeName(view.mode()), " mode with ", view.workers(),
        " worker(s) but this worker's config says ", ModeName(training.mode()), " with ",
        config_.cluster().workers(), "; start every task from the same config"));
  }
  // A shard may have gone back to its last checkpoint: the next pull takes
  // whatever it holds.
  std::fill(next_min_.begin(), next_min_.end(), 0);
  StartHeartbeats();
  return view;
}

const std::vector<VariableSpec>& ClientSession::variables() const {
  static const std::vector<VariableSpec>* const kNone = new std::vector<VariableSpec>();
  return declared() ? variables_ : *kNone;
}

absl::Status ClientSession::Declare(std::vector<VariableSpec> variables) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("declare"));
  if (declared()) {
    return absl::FailedPreconditionError(
        "the model's variables are declared already; a session declares them once");
  }
  if (variables.empty() && client_->embedding_tables().empty()) {
    return absl::InvalidArgumentError("the model declares no variables and no embedding tables");
  }
  PST_RETURN_IF_ERROR(CheckModelSize(variables));
  if (!heartbeats_.joinable()) PST_RETURN_IF_ERROR(RegisterLocked().status());
  client_->SetVariables(variables);
  PST_ASSIGN_OR_RETURN(PsClient::Tensors tensors, client_->AllocateTensors());
  variables_ = std::move(variables);
  tensors_ = std::move(tensors);
  declared_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status ClientSession::CheckDeclared(size_t spans) const {
  if (!declared()) {
    return absl::FailedPreconditionError(
        "the model's variables are not declared; call init (or declare) first");
  }
  if (spans != variables_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "got ", spans, " tensors for the ", variables_.size(), " declared variables"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ClientSession::Init(const std::vector<std::span<const float>>& values) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("init"));
  PST_RETURN_IF_ERROR(CheckDeclared(values.size()));
  return client_->Init(values);
}

std::vector<int64_t> ClientSession::MinVersionsAfter(
    const std::vector<int64_t>& computed_at) const {
  std::vector<int64_t> min_versions = computed_at;
  for (int64_t& v : min_versions) v = policy_->MinVersionAfterPush(v);
  return min_versions;
}

absl::Status ClientSession::Pull(const std::vector<std::span<float>>& out) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckDeclared(out.size()));
  const absl::Time start = absl::Now();
  PST_RETURN_IF_ERROR(client_->Pull(next_min_, pull_timeout(), out, &versions_));
  next_min_ = versions_;
  GetWorkerMetrics().pull_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  RecordVersions(versions_);
  last_step_end_ = absl::Now();
  return absl::OkStatus();
}

absl::Status ClientSession::Push(const std::vector<std::span<const float>>& gradients) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("push"));
  PST_RETURN_IF_ERROR(CheckDeclared(gradients.size()));
  const std::vector<int64_t> computed_at = versions_;
  const absl::Time start = absl::Now();
  PST_RETURN_IF_ERROR(client_->Push(computed_at, gradients, &responses_));
  ++pushes_;
  RecordStep(computed_at, start);
  // The next pull sees this push's step (SYNC waits for the other workers').
  next_min_ = MinVersionsAfter(computed_at);
  return absl::OkStatus();
}

absl::Status ClientSession::PushPull(const std::vector<std::span<const float>>& gradients,
                                     const std::vector<std::span<float>>& out) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("push_pull"));
  PST_RETURN_IF_ERROR(CheckDeclared(gradients.size()));
  PST_RETURN_IF_ERROR(CheckDeclared(out.size()));
  const std::vector<int64_t> computed_at = versions_;
  const absl::Time start = absl::Now();
  PST_RETURN_IF_ERROR(client_->PushPull(computed_at, gradients, MinVersionsAfter(computed_at),
                                        pull_timeout(), out, &versions_, &responses_));
  ++pushes_;
  next_min_ = versions_;
  RecordVersions(versions_);
  RecordStep(computed_at, start);
  return absl::OkStatus();
}

void ClientSession::RecordStep(const std::vector<int64_t>& computed_at, absl::Time push_start) {
  // As the C++ trainer records a step (worker/training/trainer.cc): the exchange,
  // and the whole step since the last one ended (the caller's compute).
  const absl::Time now = absl::Now();
  WorkerMetrics& metrics = GetWorkerMetrics();
  metrics.push_seconds.Observe(absl::ToDoubleSeconds(now - push_start));
  if (last_step_end_ != absl::InfinitePast()) {
    metrics.step_seconds.Observe(absl::ToDoubleSeconds(now - last_step_end_));
  }
  metrics.steps.Increment();
  last_step_end_ = now;
  staleness_total_ += RecordPushes(computed_at, responses_);
}

absl::Status ClientSession::Done() {
  absl::MutexLock lock(&mu_);
  StopHeartbeats();
  ended_ = true;
  return client_->Done();
}

std::vector<int64_t> ClientSession::versions() const {
  absl::MutexLock lock(&mu_);
  return versions_;
}

int64_t ClientSession::pushes() const {
  absl::MutexLock lock(&mu_);
  return pushes_;
}

std::vector<PushResponse> ClientSession::last_responses() const {
  absl::MutexLock lock(&mu_);
  return responses_;
}

int64_t ClientSession::staleness_total() const {
  absl::MutexLock lock(&mu_);
  return staleness_total_;
}

absl::StatusOr<StatsResponse> ClientSession::Stats(int shard) {
  if (shard < 0 || shard >= num_shards()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, " is not one of the ", num_shards(), " shards (0..",
                     num_shards() - 1, ")"));
  }
  return client_->Stats(shard);
}

absl::StatusOr<StatsResponse> ClientSession::AwaitWorkersDone(int64_t known_changes,
                                                              absl::Duration timeout) {
  return client_->AwaitWorkersDone(0, known_changes, timeout);
}

void ClientSession::StartHeartbeats() {
  if (heartbeats_.joinable()) return;
  stop_heartbeats_ = std::make_unique<absl::Notification>();
  const absl::Duration period = absl::Seconds(config_.training().lease_seconds()) / 4;
  heartbeats_ = std::thread([this, period, stop = stop_heartbeats_.get()] {
    while (!stop->WaitForNotificationWithTimeout(period)) {
      // A failed heartbeat is not fatal: the next exchange reports the
      // shard's state with a proper error.
      client_->Heartbeat().IgnoreError();
    }
  });
}

void ClientSession::StopHeartbeats() {
  if (!heartbeats_.joinable()) return;
  stop_heartbeats_->Notify();
  heartbeats_.join();
}

}  // namespace pst
