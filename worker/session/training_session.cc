#include "worker/session/training_session.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/replication_limits.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/client/backoff.h"
#include "worker/client/ps_client.h"
#include "worker/client/worker_metrics.h"

namespace pst {
namespace {

// A backup takes over within a fraction of a second once workers ask it
// (ShardOffice::PrimarySought): a worker looking for it looks often.
void LookOften(Retry* retry) {
  retry->backoff = absl::Milliseconds(20);
  retry->max_backoff = absl::Milliseconds(100);
}

}  // namespace
absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(const JobConfig& config,
                                                                         int rank,
                                                                         PsClient* client) {
  PST_ASSIGN_OR_RETURN(std::unique_ptr<ConsistencyPolicy> policy,
                       MakeConsistencyPolicy(ConsistencyOptionsFromConfig(config)));
  client->set_wire_dtype(WireDType(config.training().wire_dtype()));
  client->set_transport(config.cluster().shm() == SHM_OFF ? PsClient::Transport::kTcp
                                                          : PsClient::Transport::kAuto);
  client->set_call_patience(absl::Seconds(config.training().pull_timeout_seconds()));
  return std::unique_ptr<TrainingSession>(
      new TrainingSession(config, rank, client, std::move(policy)));
}

TrainingSession::TrainingSession(const JobConfig& config, int rank, PsClient* client,
                                 std::unique_ptr<const ConsistencyPolicy> policy)
    : config_(config),
      rank_(rank),
      client_(client),
      policy_(std::move(policy)),
      versions_(client->num_shards(), 0),
      next_min_(client->num_shards(), 0) {}

TrainingSession::~TrainingSession() { StopHeartbeats(); }

absl::Duration TrainingSession::patience() const {
  return absl::Seconds(config_.training().pull_timeout_seconds());
}

absl::StatusOr<RegisterResponse> TrainingSession::Join(bool wait_out_refusals) {
  absl::StatusOr<RegisterResponse> view = client_->Register();
  if (!view.ok() && wait_out_refusals && IsTransientShardError(view.status())) {
    // A shard restarting, or this worker's former process still holding
    // its lease (after a restart): waited out.
    spdlog::info("waiting for the parameter servers ({})", std::string(view.status().message()));
    Retry retry = NewRetry(patience(), rank_);
    view = RegisterPatiently(client_, view.status(), &retry);
  }
  PST_RETURN_IF_ERROR(view.status());
  const TrainingConfig& training = config_.training();
  if (view->mode() != training.mode() || view->workers() != config_.cluster().workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:0 runs ", ModeName(view->mode()), " mode with ", view->workers(),
        " worker(s) but this worker's config says ", ModeName(training.mode()), " with ",
        config_.cluster().workers(), "; start every task from the same config"));
  }
  // A shard may have gone back to its last checkpoint: the next read takes
  // whatever it holds.
  std::fill(next_min_.begin(), next_min_.end(), 0);
  parameters_current_ = false;
  StartHeartbeats();
  return view;
}

absl::StatusOr<bool> TrainingSession::Init(InitialValues initial) {
  std::vector<std::vector<float>> values = initial();
  return Init(std::vector<std::span<const float>>(values.begin(), values.end()),
              std::move(initial));
}

absl::StatusOr<bool> TrainingSession::Init(const std::vector<std::span<const float>>& values,
                                           InitialValues again) {
  initial_ = std::move(again);
  return client_->Init(values);
}

std::vector<int64_t> TrainingSession::MinVersionsAfter(
    const std::vector<int64_t>& computed_at) const {
  std::vector<int64_t> min_versions = computed_at;
  for (int64_t& v : min_versions) v = policy_->MinVersionAfterPush(v);
  return min_versions;
}

void TrainingSession::TookValues(absl::Time start) {
  next_min_ = versions_;
  GetWorkerMetrics().pull_seconds.Observe(SecondsSince(start));
  RecordVersions(versions_);
}

void TrainingSession::Pushed(const std::vector<int64_t>& computed_at, absl::Time start) {
  GetWorkerMetrics().push_seconds.Observe(SecondsSince(start));
  staleness_ += RecordPushes(computed_at, responses_);
}

absl::Status TrainingSession::Exchange(const StepRequest& request) {
  const bool pushes = request.gradients != nullptr || !request.push_rows.empty();
  const bool reads = request.values != nullptr || !request.pull_rows.empty();
  const absl::Duration timeout = patience();
  const absl::Time start = absl::Now();
  if (!pushes) {
    if (request.values == nullptr) {
      // Rows alone (an evaluation's lookups): the versions stay the last read's.
      std::vector<int64_t> versions;
      PST_RETURN_IF_ERROR(FollowingFailovers([&] {
        return client_->Exchange(
            {.min_versions = next_min_, .timeout = timeout, .pull_rows = request.pull_rows},
            &versions, nullptr);
      }));
      GetWorkerMetrics().pull_seconds.Observe(SecondsSince(start));
      return absl::OkStatus();
    }
    parameters_current_ = false;  // a failed read may have written part of them
    PST_RETURN_IF_ERROR(FollowingFailovers([&] {
      return client_->Exchange({.min_versions = next_min_,
                                .timeout = timeout,
                                .values = *request.values,
                                .pull_rows = request.pull_rows},
                               &versions_, nullptr);
    }));
    TookValues(start);
    parameters_current_ = true;
    return absl::OkStatus();
  }
  const std::vector<int64_t> computed_at = versions_;
  if (!reads) {
    ExchangeRequest push{.computed_at = computed_at, .push_rows = request.push_rows};
    if (request.gradients != nullptr) push.gradients = *request.gradients;
    PST_RETURN_IF_ERROR(
        FollowingFailovers([&] { return client_->Exchange(push, nullptr, &responses_); }));
    Pushed(computed_at, start);
    // The next read sees this push's step (SYNC waits for the other workers').
    next_min_ = MinVersionsAfter(computed_at);
    parameters_current_ = false;
    return absl::OkStatus();
  }
  if (request.gradients == nullptr) {
    return absl::InvalidArgumentError(
        "an exchange that reads pushes the dense gradients too (push rows alone, then read)");
  }
  parameters_current_ = false;  // a failed exchange may have written part of them
  ExchangeRequest step{.computed_at = computed_at,
                       .gradients = *request.gradients,
                       .push_rows = request.push_rows,
                       .min_versions = MinVersionsAfter(computed_at),
                       .timeout = timeout,
                       .pull_rows = request.pull_rows};
  if (request.values != nullptr) step.values = *request.values;
  PST_RETURN_IF_ERROR(
      FollowingFailovers([&] { return client_->Exchange(step, &versions_, &responses_); }));
  next_min_ = versions_;
  RecordVersions(versions_);
  Pushed(computed_at, start);
  parameters_current_ = request.values != nullptr;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StepExchange>> TrainingSession::BeginExchange(
    const std::vector<std::span<const float>>& gradients, const std::vector<int>& push_order,
    const std::vector<std::span<float>>& values) {
  exchange_computed_at_ = versions_;
  exchange_gradients_ = gradients;
  exchange_values_ = values;
  exchange_start_ = absl::Now();
  parameters_current_ = false;  // until the exchange has brought them all
  return client_->BeginExchange({.computed_at = exchange_computed_at_,
                                 .gradients = gradients,
                                 .min_versions = MinVersionsAfter(exchange_computed_at_),
                                 .timeout = patience(),
                                 .values = values},
                                push_order);
}

absl::Status TrainingSession::FinishExchange(std::unique_ptr<StepExchange> exchange) {
  absl::Status finished = exchange->Finish(&versions_, &responses_);
  exchange.reset();
  if (!finished.ok() && follows_failovers() && IsTransientShardError(finished)) {
    // Every gradient is final by now: the exchange is sent again whole.
    const ExchangeRequest again{.computed_at = exchange_computed_at_,
                                .gradients = exchange_gradients_,
                                .min_versions = MinVersionsAfter(exchange_computed_at_),
                                .timeout = patience(),
                                .values = exchange_values_};
    finished = SendAgainAfterFailovers(
        finished, [&] { return client_->Exchange(again, &versions_, &responses_); });
  }
  PST_RETURN_IF_ERROR(finished);
  next_min_ = versions_;
  RecordVersions(versions_);
  Pushed(exchange_computed_at_, exchange_start_);
  parameters_current_ = true;
  return absl::OkStatus();
}

void TrainingSession::CountStep(absl::Time start, int examples) {
  WorkerMetrics& metrics = GetWorkerMetrics();
  if (start != absl::InfinitePast()) metrics.step_seconds.Observe(SecondsSince(start));
  metrics.steps.Increment();
  if (examples > 0) metrics.samples.Increment(examples);
}

int64_t TrainingSession::TakeStaleness() { return std::exchange(staleness_, 0); }

bool TrainingSession::follows_failovers() const { return config_.cluster().ps_backups_size() > 0; }

absl::Status TrainingSession::FollowingFailovers(absl::FunctionRef<absl::Status()> exchange) {
  return SendAgainAfterFailovers(exchange(), exchange);
}

absl::Status TrainingSession::SendAgainAfterFailovers(absl::Status status,
                                                      absl::FunctionRef<absl::Status()> exchange) {
  if (status.ok() || !follows_failovers() || !IsTransientShardError(status)) return status;
  Retry retry = NewRetry(patience(), rank_);
  LookOften(&retry);
  while (!status.ok() && IsTransientShardError(status)) {
    spdlog::warn("{}; finding the shards' primaries to send the exchange again",
                 std::string(status.message()));
    PST_ASSIGN_OR_RETURN(RegisterResponse view, RegisterPatiently(client_, status, &retry));
    // A primary may have shown this worker updates it had not yet
    // replicated (an ASYNC read shows other workers' pushes as they land),
    // at most a backup's allowed lag; so far behind is a primary that went
    // on from its checkpoint allowed to be too, and the exchange is sent
    // again at its version (ShardChannel::TagPush). Further behind, the
    // step is run again on what the shards hold (Redo), whose rejoin ends
    // the run if that lost more than a checkpoint interval.
    if (!view.initialized() || versions_[0] - view.version() > kMaxUnreplicatedVersions) {
      return status;
    }
    ++resent_exchanges_;
    status = exchange();
  }
  return status;
}

absl::Status TrainingSession::Redo(absl::FunctionRef<absl::Status()> step) {
  absl::Status status = step();
  if (status.ok() || !IsTransientShardError(status)) return status;
  // One budget for the refusals in a row: a shard that keeps refusing ends
  // the run once it is spent.
  Retry retry = NewRetry(patience(), rank_);
  // A shard away is most likely failing over (an overloaded one is given room).
  if (follows_failovers() && TransientRefusalOf(status) != TransientRefusal::kOverloaded) {
    LookOften(&retry);
  }
  while (!status.ok() && IsTransientShardError(status)) {
    PST_RETURN_IF_ERROR(Rejoin(status, &retry));
    ++redone_steps_;
    status = step();
  }
  return status;
}

absl::Status TrainingSession::Rejoin(const absl::Status& cause, Retry* retry) {
  const std::optional<TransientRefusal> why = TransientRefusalOf(cause);
  spdlog::warn("{} ({}); reconnecting",
               why == TransientRefusal::kRestarting ? "lost a parameter server"
                                                    : "refused for now",
               std::string(cause.message()));
  PST_ASSIGN_OR_RETURN(RegisterResponse view, RegisterPatiently(client_, cause, retry));
  // A shard restarted from its checkpoint goes back at most a checkpoint
  // interval; one that went back further (or came back with no model at
  // all) lost the run's updates, and training on would hide that.
  const CheckpointConfig& checkpoints = config_.training().checkpoint();
  const int64_t may_lose = checkpoints.dir().empty() ? 0 : checkpoints.every_steps();
  const int64_t now_at = view.initialized() ? view.version() : 0;
  if (versions_[0] - now_at > may_lose) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:0 came back at version ", now_at, view.initialized() ? "" : " without the model",
        " after this worker had seen version ", versions_[0], ": ", versions_[0] - now_at,
        " updates are gone, more than a checkpoint interval (training.checkpoint.every_steps: ",
        may_lose, "); restore its checkpoint directory, or start the job again"));
  }
  // A shard restarted without a checkpoint needs its variables again.
  if (!view.initialized() && initial_) {
    std::vector<std::vector<float>> values = initial_();
    PST_RETURN_IF_ERROR(
        client_->Init(std::vector<std::span<const float>>(values.begin(), values.end()))
            .status());
  }
  // The shard may have gone back to its last checkpoint: take what it has.
  std::fill(next_min_.begin(), next_min_.end(), 0);
  parameters_current_ = false;
  spdlog::info("reconnected; shard 0 is at version {}", view.version());
  return absl::OkStatus();
}

absl::Status TrainingSession::Finish() {
  StopHeartbeats();
  return client_->Done();
}

absl::StatusOr<WorkersAtEnd> TrainingSession::AwaitWorkersDone() {
  return AwaitAllWorkersDone(client_, config_.cluster().workers(), patience());
}

void TrainingSession::StartHeartbeats() {
  if (heartbeats_.joinable()) return;
  stop_heartbeats_ = std::make_unique<absl::Notification>();
  heartbeats_ = std::thread([this, lease = absl::Seconds(config_.training().lease_seconds()),
                             stop = stop_heartbeats_.get()] {
    HeartbeatUntil(client_, lease, stop);
  });
}

void TrainingSession::StopHeartbeats() {
  if (!heartbeats_.joinable()) return;
  stop_heartbeats_->Notify();
  heartbeats_.join();
}

}  // namespace pst
