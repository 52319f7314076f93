#include "worker/training/trainer.h"

#include <algorithm>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/model/tensor_allocator.h"
#include "worker/client/worker_metrics.h"

namespace pst {
namespace {

// Evaluation runs forward passes over the test set in batches of this size.
constexpr int kEvalBatch = 500;

// Test sets of the synthetic problems are drawn from a different seed.
constexpr uint64_t kTestSeedOffset = 0x9E3779B97F4A7C15ULL;

// Classification accuracy of an evaluation; none for regression.
std::optional<double> Accuracy(const LossResult& evaluation, const Dataset& data) {
  if (data.num_classes == 0) return std::nullopt;
  return static_cast<double>(evaluation.correct) / data.size;
}

// The transport's memory as the model's allocator: each variable's spans
// where the client's exchanges read its gradient and leave its values
// (PsClient::AllocateTensors), in a co-located shard's region where it
// lies whole on one.
class ClientTensors final : public TensorAllocator {
 public:
  explicit ClientTensors(PsClient::Tensors tensors) : tensors_(std::move(tensors)) {}
  absl::StatusOr<Memory> Allocate(int index, const VariableSpec& spec) override {
    if (index < 0 || static_cast<size_t>(index) >= tensors_.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the client holds ", tensors_.values.size(), " variables; the model asks for ",
          spec.name, " as number ", index, " (give the client the model's variables)"));
    }
    return Memory{.values = tensors_.values[index], .gradient = tensors_.gradients[index]};
  }

 private:
  const PsClient::Tensors tensors_;
};

bool SharesMemoryWithAShard(const PsClient& client) {
  for (int s = 0; s < client.num_shards(); ++s) {
    if (client.uses_shared_memory(s)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<TrainingData> LoadTrainingData(const TrainingConfig& training) {
  const DatasetConfig& dataset = training.dataset();
  uint64_t seed = training.seed();
  uint64_t test_seed = seed + kTestSeedOffset;
  TrainingData data;
  switch (dataset.kind_case()) {
    case DatasetConfig::kFashionMnist: {
      const FashionMnistConfig& fm = dataset.fashion_mnist();
      absl::StatusOr<Dataset> train = LoadFashionMnist(fm.dir(), true, fm.train_limit());
      if (!train.ok()) return train.status();
      absl::StatusOr<Dataset> test = LoadFashionMnist(fm.dir(), false);
      if (!test.ok()) return test.status();
      data.train = std::move(*train);
      data.test = std::move(*test);
      return data;
    }
    case DatasetConfig::kQuadratic:
      data.train = MakeQuadratic(dataset.quadratic().examples(), seed);
      data.test = MakeQuadratic(dataset.quadratic().examples(), test_seed);
      return data;
    case DatasetConfig::kParabola:
      data.train = MakeParabola(dataset.parabola().examples(), seed);
      data.test = MakeParabola(dataset.parabola().examples(), test_seed);
      return data;
    case DatasetConfig::kLinearRegression: {
      const LinearRegressionConfig& lr = dataset.linear_regression();
      // Same true weights (seed) for both sets; only the samples differ.
      data.train = MakeLinearRegression(lr.examples(), lr.features(), lr.noise(), seed);
      data.test = MakeLinearRegression(lr.examples(), lr.features(), lr.noise(), seed);
      return data;
    }
    case DatasetConfig::kCtr:  // streamed by the CtrTrainer, never loaded whole
    case DatasetConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the config names no data set this trainer loads");
}

MlpSpec ModelSpecFor(const TrainingConfig& training, const Dataset& data) {
  const MlpConfig& mlp = training.model().mlp();
  MlpSpec spec;
  spec.input_dim = data.feature_dim;
  spec.hidden.assign(mlp.hidden().begin(), mlp.hidden().end());
  spec.output_dim = data.num_classes > 0 ? data.num_classes : data.target_dim;
  spec.activation = mlp.activation() == TANH ? ActivationKind::kTanh : ActivationKind::kRelu;
  spec.loss = data.num_classes > 0 ? LossKind::kSoftmaxCrossEntropy : LossKind::kMeanSquaredError;
  spec.use_bias = !mlp.no_bias();
  return spec;
}

Trainer::Trainer(const JobConfig& config, int rank, PsClient* client,
                 std::vector<Kernels*> towers, const TrainingData* data)
    : config_(config), rank_(rank), client_(client), backends_(std::move(towers)), data_(data) {}

absl::Status Trainer::Setup() {
  const TrainingConfig& training = config_.training();
  absl::StatusOr<std::unique_ptr<ConsistencyPolicy>> policy =
      MakeConsistencyPolicy(ConsistencyOptionsFromConfig(config_));
  if (!policy.ok()) return policy.status();
  policy_ = std::move(*policy);
  int batch = training.batch_size();
  absl::StatusOr<std::unique_ptr<Towers>> towers =
      Towers::Create(ModelSpecFor(training, data_->train), backends_, batch, kEvalBatch);
  if (!towers.ok()) return towers.status();
  towers_ = std::move(*towers);
  sampler_ = std::make_unique<ShardSampler>(data_->train.size, rank_, config_.cluster().workers(),
                                            batch, training.seed());
  if (sampler_->steps_per_epoch() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", data_->train.size, " examples, fewer than workers x batch_size = ",
        config_.cluster().workers() * batch, "; lower batch_size or workers"));
  }
  // Batches are gathered straight into tower 0's staging buffers, from
  // which a GPU backend uploads them by DMA.
  batch_x_ = towers_->HostInput().first(static_cast<size_t>(batch) * data_->train.feature_dim);
  batch_y_ = towers_->HostTargets().first(static_cast<size_t>(batch) * data_->train.target_dim);

  for (int layer = towers_->num_layers(); layer-- > 0;) {
    for (int v : towers_->LayerVariables(layer)) push_order_.push_back(v);
  }
  client_->SetVariables(towers_->variables());
  client_->set_wire_dtype(WireDType(training.wire_dtype()));
  client_->set_transport(config_.cluster().shm() == SHM_OFF ? PsClient::Transport::kTcp
                                                            : PsClient::Transport::kAuto);
  absl::StatusOr<RegisterResponse> view = client_->Register();
  if (!view.ok() && IsTransientShardError(view.status())) {
    // A shard restarting, or this worker's former process still holding
    // its lease (after a restart): waited out.
    spdlog::info("waiting for the parameter servers ({})", std::string(view.status().message()));
    Retry retry = NewRetry();
    view = RegisterPatiently(client_, view.status(), &retry);
  }
  if (!view.ok()) return view.status();
  if (view->mode() != training.mode() || view->workers() != config_.cluster().workers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:0 runs ", ModeName(view->mode()), " mode with ", view->workers(),
        " worker(s) but this worker's config says ", ModeName(training.mode()), " with ",
        config_.cluster().workers(), "; start every task from the same config"));
  }
  if (towers_->ComputesOnHostMemory()) {
    // The model computes where the exchange reads its gradients and leaves
    // its parameters (in a co-located shard's region): no copies per step.
    absl::StatusOr<PsClient::Tensors> tensors = client_->AllocateTensors();
    if (!tensors.ok()) return tensors.status();
    if (SharesMemoryWithAShard(*client_)) {
      ClientTensors allocator(*std::move(tensors));
      PST_RETURN_IF_ERROR(towers_->AllocateFrom(allocator));
    }
  }
  for (size_t i = 0; i < towers_->variables().size(); ++i) {
    parameters_.push_back(towers_->HostParameter(i));
    gradients_.push_back(towers_->HostGradient(i));
    variable_names_.push_back(towers_->variables()[i].name);
  }
  // Every worker offers the same seeded values; the first to arrive wins, so
  // the job does not depend on the chief being first or alive.
  std::vector<std::vector<float>> initial = towers_->InitialValues(training.seed());
  std::vector<std::span<const float>> initial_spans(initial.begin(), initial.end());
  absl::StatusOr<bool> accepted = client_->Init(initial_spans);
  if (!accepted.ok()) return accepted.status();
  spdlog::info("worker:{} registered: {} mode, {} worker(s), {} shard(s), model {} parameters{}",
               rank_, ModeName(view->mode()), view->workers(), client_->num_shards(),
               towers_->num_parameters(), *accepted ? " (initialized the variables)" : "");
  resume_clock_ = view->worker_clock();
  if (resume_clock_ > 0) {
    spdlog::info("worker:{} rejoins after {} steps: resuming at version {}", rank_, resume_clock_,
                 view->version());
  }
  versions_.assign(client_->num_shards(), 0);
  next_min_.assign(client_->num_shards(), 0);
  progress_ = std::make_unique<Progress>(live_progress_ && Progress::IsTerminal(),
                                         sampler_->steps_per_epoch() * training.epochs(),
                                         towers_->DevicesLabel());
  recorder_ = std::make_unique<RunRecorder>(is_chief() ? events_ : nullptr);
  return absl::OkStatus();
}

absl::Status Trainer::PullParameters(const std::vector<int64_t>& min_versions) {
  absl::Duration timeout = absl::Seconds(config_.training().pull_timeout_seconds());
  const absl::Time start = absl::Now();
  PST_RETURN_IF_ERROR(towers_->PrepareHostParametersForWrite());
  if (absl::Status s = client_->Pull(min_versions, timeout, parameters_, &versions_); !s.ok()) {
    return s;
  }
  GetWorkerMetrics().pull_seconds.Observe(SecondsSince(start));
  RecordVersions(versions_);
  return towers_->UploadParameters();
}

absl::Status Trainer::RunEpoch(int epoch, int64_t first_step, WorkerResult* result) {
  const TrainingConfig& training = config_.training();
  const int batch = training.batch_size();
  const int64_t steps = sampler_->steps_per_epoch();
  const int log_every = training.log_every_steps();
  std::vector<PushResponse> responses;
  double epoch_loss = 0.0;
  double window_loss = 0.0;
  absl::Time epoch_start = absl::Now();
  absl::Time window_start = epoch_start;
  for (int64_t step = first_step; step < steps; ++step) {
    absl::StatusOr<LossResult> loss = RunStep(epoch, step, &responses);
    // A shard that went away (crashed, restarting from its checkpoint) or
    // refused for now (busy, lost the region) is waited for with backoff;
    // the step is then redone on whatever the shard holds.
    if (!loss.ok() && IsTransientShardError(loss.status())) {
      // One budget for the refusals in a row: a shard that keeps refusing
      // ends the run once it is spent.
      Retry retry = NewRetry();
      while (!loss.ok() && IsTransientShardError(loss.status())) {
        exchange_.reset();  // cancelled: the shards' state is read afresh
        PST_RETURN_IF_ERROR(Reconnect(loss.status(), &retry));
        loss = RunStep(epoch, step, &responses);
      }
    }
    if (!loss.ok()) return loss.status();
    epoch_loss += loss->loss;
    window_loss += loss->loss;
    result->set_steps(result->steps() + 1);
    result->set_samples(result->samples() + batch);
    const bool window_end = (step + 1) % log_every == 0 || step + 1 == steps;
    if (window_end || progress_->live()) {
      const int64_t in_window = std::min<int64_t>((step % log_every) + 1, step - first_step + 1);
      ProgressPoint point{epoch, training.epochs(), step + 1, steps, window_loss / in_window,
                          in_window * batch / SecondsSince(window_start), versions_[0]};
      progress_->Report(point, epoch * steps + step + 1);
    }
    if (window_end) {
      RecordGradientNorms(variable_names_, gradients_);
      const int64_t in_window = std::min<int64_t>((step % log_every) + 1, step - first_step + 1);
      recorder_->OnWindow({epoch * steps + step + 1, window_loss / in_window,
                           in_window * batch / SecondsSince(window_start),
                           static_cast<double>(window_staleness_) / in_window,
                           versions_[0]},
                          result);
      window_staleness_ = 0;
      window_loss = 0.0;
      window_start = absl::Now();
    }
  }
  // The epoch's last exchange: its values are the model the epoch ends with.
  absl::Status finished = FinishExchange(&responses, /*upload=*/true);
  for (Retry retry = NewRetry(); !finished.ok() && IsTransientShardError(finished);) {
    PST_RETURN_IF_ERROR(Reconnect(finished, &retry));
    finished = PullParameters(next_min_);
  }
  if (!finished.ok()) return finished;
  train_seconds_ += SecondsSince(epoch_start);
  last_epoch_loss_ = epoch_loss / std::max<int64_t>(1, steps - first_step);
  progress_->Finish();
  return absl::OkStatus();
}

std::vector<int64_t> Trainer::MinVersionsAfter(const std::vector<int64_t>& computed_at) const {
  std::vector<int64_t> min_versions = computed_at;
  for (int64_t& v : min_versions) v = policy_->MinVersionAfterPush(v);
  return min_versions;
}

void Trainer::RecordExchange(const std::vector<int64_t>& computed_at,
                             const std::vector<PushResponse>& responses, absl::Time push_start) {
  next_min_ = versions_;
  WorkerMetrics& metrics = GetWorkerMetrics();
  metrics.push_seconds.Observe(SecondsSince(push_start));
  RecordVersions(versions_);
  window_staleness_ += RecordPushes(computed_at, responses);
}

void Trainer::RecordStep(absl::Time start, int batch) {
  WorkerMetrics& metrics = GetWorkerMetrics();
  metrics.step_seconds.Observe(SecondsSince(start));
  metrics.steps.Increment();
  metrics.samples.Increment(batch);
}

absl::StatusOr<LossResult> Trainer::RunStep(int epoch, int64_t step,
                                            std::vector<PushResponse>* responses) {
  if (config_.training().exchange() == LAYERWISE) return RunStepLayerwise(epoch, step, responses);
  const absl::Time start = absl::Now();
  if (!parameters_current_) {
    PST_RETURN_IF_ERROR(PullParameters(next_min_));
  }
  const int batch = config_.training().batch_size();
  const Dataset& train = data_->train;
  gather_.Wait();
  absl::StatusOr<LossResult> loss;
  if (gathered_ == std::make_pair(epoch, step)) {
    loss = towers_->ComputeGradients(batch_x_.data(), batch_y_.data(), batch);
  } else {
    const std::span<const int64_t> rows = sampler_->Batch(epoch, step);
    loss = towers_->ComputeGradients(
        batch_x_.data(), batch_y_.data(), batch, [&](int first, int count) {
          GatherBatch(train, rows.subspan(first, count),
                      batch_x_.data() + static_cast<size_t>(first) * train.feature_dim,
                      batch_y_.data() + static_cast<size_t>(first) * train.target_dim);
        });
  }
  gathered_ = {-1, -1};
  if (!loss.ok()) return loss;
  if (before_push_) before_push_();
  // The gradient goes out and the next step's parameters come back in one
  // exchange (PsClient::PushPull).
  const std::vector<int64_t> computed_at = versions_;
  const absl::Time push_start = absl::Now();
  parameters_current_ = false;  // a failed exchange may have written part of them
  PST_RETURN_IF_ERROR(towers_->PrepareHostParametersForWrite());
  if (towers_->ComputesOnHostMemory() && step + 1 < sampler_->steps_per_epoch()) {
    const std::span<const int64_t> next_rows = sampler_->Batch(epoch, step + 1);
    gathered_ = {epoch, step + 1};
    gather_ = gather_thread_.Start(
        [&train, next_rows, x = batch_x_.data(), y = batch_y_.data()] {
          GatherBatch(train, next_rows, x, y);
        });
  }
  if (absl::Status s = client_->PushPull(
          computed_at, gradients_, MinVersionsAfter(computed_at),
          absl::Seconds(config_.training().pull_timeout_seconds()), parameters_, &versions_,
          responses);
      !s.ok()) {
    return s;
  }
  parameters_current_ = true;
  RecordExchange(computed_at, *responses, push_start);
  RecordStep(start, batch);
  PST_RETURN_IF_ERROR(towers_->UploadParameters());
  return loss;
}

absl::StatusOr<LossResult> Trainer::RunStepLayerwise(int epoch, int64_t step,
                                                     std::vector<PushResponse>* responses) {
  const absl::Time start = absl::Now();
  if (!parameters_current_ && exchange_ == nullptr) {
    PST_RETURN_IF_ERROR(PullParameters(next_min_));
  }
  const int batch = config_.training().batch_size();
  GatherBatch(data_->train, sampler_->Batch(epoch, step), batch_x_.data(), batch_y_.data());
  std::unique_ptr<StepExchange> pushing;  // this step's exchange, begun by its first push
  absl::Mutex pushing_mu;
  Mlp::LayerHooks hooks{
      .parameters_needed = [this](int layer) -> absl::Status {
        if (exchange_ == nullptr) return absl::OkStatus();  // pulled whole
        for (int v : towers_->LayerVariables(layer)) {
          PST_RETURN_IF_ERROR(exchange_->AwaitValues(v));
        }
        return absl::OkStatus();
      },
      .gradients_ready = [&](int layer) -> absl::Status {
        absl::MutexLock lock(&pushing_mu);
        if (pushing == nullptr) {
          // The forward pass has taken every value of the last exchange:
          // end it (its versions tag this push), and begin this step's.
          PST_RETURN_IF_ERROR(FinishExchange(responses, /*upload=*/false));
          if (before_push_) before_push_();
          exchange_computed_at_ = versions_;
          exchange_start_ = absl::Now();
          // The exchange writes the next values into the host parameters.
          PST_RETURN_IF_ERROR(towers_->PrepareHostParametersForWrite());
          absl::StatusOr<std::unique_ptr<StepExchange>> begun = client_->BeginExchange(
              exchange_computed_at_, gradients_, push_order_,
              MinVersionsAfter(exchange_computed_at_),
              absl::Seconds(config_.training().pull_timeout_seconds()), parameters_);
          if (!begun.ok()) return begun.status();
          pushing = std::move(*begun);
        }
        const std::vector<int> variables = towers_->LayerVariables(layer);
        return pushing->Push(variables);
      }};
  absl::StatusOr<LossResult> loss =
      towers_->ComputeGradients(batch_x_.data(), batch_y_.data(), batch, hooks);
  if (!loss.ok()) {
    // A failed exchange may have written part of the parameters.
    exchange_.reset();
    parameters_current_ = false;
    return loss;
  }
  exchange_ = std::move(pushing);
  parameters_current_ = false;  // until the exchange has brought them all
  RecordStep(start, batch);
  return loss;
}

absl::Status Trainer::FinishExchange(std::vector<PushResponse>* responses, bool upload) {
  if (exchange_ == nullptr) return absl::OkStatus();
  std::unique_ptr<StepExchange> exchange = std::move(exchange_);
  if (absl::Status s = exchange->Finish(&versions_, responses); !s.ok()) {
    parameters_current_ = false;
    return s;
  }
  parameters_current_ = true;
  RecordExchange(exchange_computed_at_, *responses, exchange_start_);
  return upload ? towers_->UploadParameters() : absl::OkStatus();
}

absl::Status Trainer::Reconnect(const absl::Status& cause, Retry* retry) {
  spdlog::warn("{} ({}); reconnecting",
               absl::IsUnavailable(cause) ? "lost a parameter server" : "refused for now",
               std::string(cause.message()));
  absl::StatusOr<RegisterResponse> view = RegisterPatiently(client_, cause, retry);
  if (!view.ok()) return view.status();
  // A shard restarted from its checkpoint goes back at most a checkpoint
  // interval; one that went back further (or came back with no model at
  // all) lost the run's updates, and training on would hide that.
  const CheckpointConfig& checkpoints = config_.training().checkpoint();
  const int64_t may_lose = checkpoints.dir().empty() ? 0 : checkpoints.every_steps();
  const int64_t now_at = view->initialized() ? view->version() : 0;
  if (versions_[0] - now_at > may_lose) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ps:0 came back at version ", now_at, view->initialized() ? "" : " without the model",
        " after this worker had seen version ", versions_[0], ": ", versions_[0] - now_at,
        " updates are gone, more than a checkpoint interval (training.checkpoint.every_steps: ",
        may_lose, "); restore its checkpoint directory, or start the job again"));
  }
  // A shard restarted without a checkpoint needs its variables again.
  if (!view->initialized()) {
    std::vector<std::vector<float>> initial = towers_->InitialValues(config_.training().seed());
    std::vector<std::span<const float>> spans(initial.begin(), initial.end());
    if (absl::StatusOr<bool> init = client_->Init(spans); !init.ok()) return init.status();
  }
  // The shard may have gone back to its last checkpoint: take what it has.
  std::fill(next_min_.begin(), next_min_.end(), 0);
  parameters_current_ = false;
  spdlog::info("reconnected; shard 0 is at version {}", view->version());
  return absl::OkStatus();
}

Retry Trainer::NewRetry() const {
  return pst::NewRetry(absl::Seconds(config_.training().pull_timeout_seconds()), rank_);
}

absl::StatusOr<LossResult> Trainer::Evaluate(const Dataset& data) {
  LossResult total;
  std::vector<float> x(static_cast<size_t>(kEvalBatch) * data.feature_dim);
  std::vector<float> y(static_cast<size_t>(kEvalBatch) * data.target_dim);
  std::vector<int64_t> indices;
  for (int64_t start = 0; start < data.size; start += kEvalBatch) {
    int rows = static_cast<int>(std::min<int64_t>(kEvalBatch, data.size - start));
    indices.resize(rows);
    for (int i = 0; i < rows; ++i) indices[i] = start + i;
    GatherBatch(data, indices, x.data(), y.data());
    absl::StatusOr<LossResult> part = towers_->Evaluate(x.data(), y.data(), rows);
    if (!part.ok()) return part.status();
    total.loss += part->loss * rows;
    total.correct += part->correct;
  }
  total.loss /= static_cast<double>(data.size);
  return total;
}

absl::Status Trainer::EvaluateFinal(WorkerResult* result) {
  absl::StatusOr<WorkersAtEnd> workers =
      AwaitAllWorkersDone(client_, config_.cluster().workers(),
                          absl::Seconds(config_.training().pull_timeout_seconds()));
  if (!workers.ok()) return workers.status();
  const CheckpointStats& restored = workers->stats.checkpoint();
  if (result->steps() == 0 && workers->stats.pushes_applied() == 0 &&
      workers->stats.pushes_aggregated() == 0 && restored.restored_version() >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no training happened: ps:0 restored version ", restored.restored_version(),
        ", where every worker had already done its steps (a finished run); to train again, "
        "start the PS with --checkpoint_start=fresh"));
  }
  PST_RETURN_IF_ERROR(PullParameters(std::vector<int64_t>(versions_.size(), 0)));
  absl::StatusOr<LossResult> test = Evaluate(data_->test);
  if (!test.ok()) return test.status();
  result->set_test_loss(test->loss);
  const int epochs = config_.training().epochs();
  recorder_->OnEvaluation(epochs, epochs * sampler_->steps_per_epoch(), test->loss,
                          Accuracy(*test, data_->test), result);
  std::vector<std::string> missing;
  for (int worker : workers->missing) {
    result->add_missing_workers(worker);
    missing.push_back(absl::StrCat("worker:", worker));
  }
  const std::string without =
      missing.empty() ? ""
                      : absl::StrCat(" (without ", absl::StrJoin(missing, ", "),
                                     ": gone for good, neither done nor back within "
                                     "training.pull_timeout_seconds)");
  if (data_->test.num_classes > 0) {
    result->set_has_test_accuracy(true);
    result->set_test_accuracy(static_cast<double>(test->correct) / data_->test.size);
    spdlog::info("final: version {} test_accuracy {:.4f} test_loss {:.4f}{}", versions_[0],
                 result->test_accuracy(), test->loss, without);
  } else {
    spdlog::info("final: version {} test_loss {:.6f}{}", versions_[0], test->loss, without);
  }
  if (!missing.empty() && config_.training().require_all_workers()) {
    return absl::DeadlineExceededError(absl::StrCat(
        absl::StrJoin(missing, ", "), " did not finish, and training.require_all_workers is set"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerResult> Trainer::Run() {
  WorkerResult result;
  result.set_task(absl::StrCat("worker:", rank_));
  PST_RETURN_IF_ERROR(Setup());
  result.set_devices(towers_->DevicesLabel());
  absl::Notification stop_heartbeats;
  std::thread heartbeats([this, &stop_heartbeats] {
    HeartbeatUntil(client_, absl::Seconds(config_.training().lease_seconds()),
                   &stop_heartbeats);
  });
  absl::StatusOr<WorkerResult> trained = Train(std::move(result));
  stop_heartbeats.Notify();
  heartbeats.join();
  return trained;
}

absl::StatusOr<WorkerResult> Trainer::Train(WorkerResult result) {
  const int epochs = config_.training().epochs();
  const int64_t steps = sampler_->steps_per_epoch();
  for (int epoch = static_cast<int>(resume_clock_ / steps); epoch < epochs; ++epoch) {
    const int64_t first_step = epoch == resume_clock_ / steps ? resume_clock_ % steps : 0;
    PST_RETURN_IF_ERROR(RunEpoch(epoch, first_step, &result));
    if (is_chief() && epoch + 1 < epochs) {
      // Evaluate the model as it stands after this epoch's last step.
      PST_RETURN_IF_ERROR(PullParameters(next_min_));
      absl::Time start = absl::Now();
      absl::StatusOr<LossResult> test = Evaluate(data_->test);
      if (!test.ok()) return test.status();
      recorder_->OnEvaluation(epoch + 1, (epoch + 1) * steps, test->loss,
                              Accuracy(*test, data_->test), &result);
      spdlog::info("epoch {}/{} done: train_loss {:.4f} test_loss {:.4f}{} ({:.1f} s to evaluate)",
                   epoch + 1, epochs, last_epoch_loss_, test->loss,
                   data_->test.num_classes > 0
                       ? absl::StrCat(" test_accuracy ",
                                      absl::StrFormat("%.4f", static_cast<double>(test->correct) /
                                                                  data_->test.size))
                       : std::string(),
                   SecondsSince(start));
    }
  }
  result.set_train_seconds(train_seconds_);
  result.set_final_loss(last_epoch_loss_);
  PST_RETURN_IF_ERROR(client_->Done());
  if (is_chief()) {
    PST_RETURN_IF_ERROR(EvaluateFinal(&result));
  }
  result.set_final_version(versions_[0]);
  return result;
}

}  // namespace pst
