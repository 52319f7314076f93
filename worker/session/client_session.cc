#include "worker/session/client_session.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "spdlog/spdlog.h"

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

// The task the launcher gave this process: TF_CONFIG's or torchrun's, else
// RANK alone (a script started with RANK and a config), else worker:0.
absl::StatusOr<TaskId> TaskFromEnvironment() {
  PST_ASSIGN_OR_RETURN(std::optional<TfConfig> cluster, ClusterFromEnvironment());
  if (cluster && cluster->task) return *cluster->task;
  int rank = 0;
  if (const char* text = std::getenv("RANK"); text != nullptr && *text != '\0') {
    if (!absl::SimpleAtoi(text, &rank) || rank < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RANK=", text,
          " is not a worker's index; set RANK to 0, 1, ... or PSTRAIN_TASK to worker:<index>"));
    }
  }
  return TaskId{TaskId::Kind::kWorker, rank};
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClientSession>> ClientSession::Open(
    const std::string& config_path, const std::string& task_text,
    absl::Duration connect_timeout) {
  PST_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(config_path, ConfigOverrides()));
  PST_ASSIGN_OR_RETURN(TaskId task,
                       task_text.empty() ? TaskFromEnvironment() : ParseTask(task_text));
  if (task.kind != TaskId::Kind::kWorker) {
    return absl::InvalidArgumentError(
        absl::StrCat("task \"", task_text, "\" is not a worker; use worker:<index>"));
  }
  PST_RETURN_IF_ERROR(ValidateTask(config, task));
  PST_ASSIGN_OR_RETURN(ClusterSecurity security,
                       ClusterSecurity::FromConfig(config.cluster(),
                                                   ClusterSecurity::Role::kClient));
  for (const std::string& warning : security.warnings()) spdlog::warn("{}", warning);
  std::vector<std::string> addresses(config.cluster().ps().begin(), config.cluster().ps().end());
  PST_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                       PsClient::Connect(addresses, task.index, connect_timeout, security,
                                         ShardBackups(config.cluster())));
  const auto& tables = config.training().model().embeddings();
  client->SetEmbeddingTables({tables.begin(), tables.end()});
  std::unique_ptr<ClientSession> opened(new ClientSession(std::move(config), std::move(client)));
  absl::MutexLock lock(&opened->mu_);
  PST_ASSIGN_OR_RETURN(opened->session_, TrainingSession::Create(opened->config_, task.index,
                                                                 opened->client_.get()));
  return opened;
}

ClientSession::ClientSession(JobConfig config, std::unique_ptr<PsClient> client)
    : config_(std::move(config)), client_(std::move(client)) {}

ClientSession::~ClientSession() {
  absl::MutexLock lock(&mu_);
  session_.reset();  // stops the heartbeats
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
  // A shard away, restarting or still holding this worker's former
  // process is waited out, as the worker binary waits.
  return session_->Join(/*wait_out_refusals=*/true);
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
  if (!session_->joined()) PST_RETURN_IF_ERROR(RegisterLocked().status());
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
  // A shard that comes back without the model gets the values this worker
  // holds then.
  return session_->Init(values, [this] {
    std::vector<std::vector<float>> current;
    for (std::span<float> v : tensors_->values) current.emplace_back(v.begin(), v.end());
    return current;
  });
}

absl::Status ClientSession::Pull(const std::vector<std::span<float>>& out) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckDeclared(out.size()));
  // The lambda runs within Redo, under this lock (the analysis sees no lock in a lambda).
  TrainingSession* session = session_.get();
  PST_RETURN_IF_ERROR(session->Redo([&] { return session->Exchange({.values = &out}); }));
  last_step_end_ = absl::Now();
  return absl::OkStatus();
}

absl::Status ClientSession::PushStep(const StepRequest& request) {
  TrainingSession* session = session_.get();  // for the lambda, run under this lock
  PST_RETURN_IF_ERROR(session->Redo([&] { return session->Exchange(request); }));
  ++pushes_;
  // As a C++ trainer counts a step: the whole step since the last one
  // ended (the caller's compute and this exchange).
  session_->CountStep(last_step_end_, /*examples=*/0);
  last_step_end_ = absl::Now();
  staleness_total_ += session_->TakeStaleness();
  return absl::OkStatus();
}

absl::Status ClientSession::Push(const std::vector<std::span<const float>>& gradients) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("push"));
  PST_RETURN_IF_ERROR(CheckDeclared(gradients.size()));
  return PushStep({.gradients = &gradients});
}

absl::Status ClientSession::PushPull(const std::vector<std::span<const float>>& gradients,
                                     const std::vector<std::span<float>>& out) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("push_pull"));
  PST_RETURN_IF_ERROR(CheckDeclared(gradients.size()));
  PST_RETURN_IF_ERROR(CheckDeclared(out.size()));
  return PushStep({.gradients = &gradients, .values = &out});
}

absl::Status ClientSession::Done() {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  return session_->Finish();
}

std::vector<int64_t> ClientSession::versions() const {
  absl::MutexLock lock(&mu_);
  return session_->versions();
}

int64_t ClientSession::pushes() const {
  absl::MutexLock lock(&mu_);
  return pushes_;
}

int64_t ClientSession::redone_steps() const {
  absl::MutexLock lock(&mu_);
  return session_->redone_steps();
}

std::vector<PushResponse> ClientSession::last_responses() const {
  absl::MutexLock lock(&mu_);
  return session_->last_responses();
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

}  // namespace pst
