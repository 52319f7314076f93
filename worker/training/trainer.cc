#include "worker/training/trainer.h"

#include <algorithm>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/npz.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/client/worker_metrics.h"
#include "worker/model/tensor_allocator.h"

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
      PST_ASSIGN_OR_RETURN(data.train, LoadFashionMnist(fm.dir(), true, fm.train_limit()));
      PST_ASSIGN_OR_RETURN(data.test, LoadFashionMnist(fm.dir(), false));
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
  PST_ASSIGN_OR_RETURN(session_, TrainingSession::Create(config_, rank_, client_));
  const int batch = training.batch_size();
  PST_ASSIGN_OR_RETURN(towers_, Towers::Create(ModelSpecFor(training, data_->train), backends_,
                                               batch, kEvalBatch));
  sampler_ = std::make_unique<ShardSampler>(data_->train.size, rank_, config_.cluster().workers(),
                                            batch, training.seed());
  if (sampler_->steps_per_epoch() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", data_->train.size, " examples, fewer than workers x batch_size = ",
        config_.cluster().workers() * batch, "; lower batch_size or workers"));
  }
  // Batches are gathered straight into tower 0's staging buffers, from
  // which a GPU backend uploads them by DMA.
  staging_.x = towers_->HostInput().first(static_cast<size_t>(batch) * data_->train.feature_dim);
  staging_.y = towers_->HostTargets().first(static_cast<size_t>(batch) * data_->train.target_dim);

  for (int layer = towers_->num_layers(); layer-- > 0;) {
    for (int v : towers_->LayerVariables(layer)) tensors_.push_order.push_back(v);
  }
  client_->SetVariables(towers_->variables());
  PST_ASSIGN_OR_RETURN(RegisterResponse view, session_->Join());
  if (towers_->ComputesOnHostMemory()) {
    // The model computes where the exchange reads its gradients and leaves
    // its parameters (in a co-located shard's region): no copies per step.
    PST_ASSIGN_OR_RETURN(PsClient::Tensors tensors, client_->AllocateTensors());
    if (SharesMemoryWithAShard(*client_)) {
      ClientTensors allocator(std::move(tensors));
      PST_RETURN_IF_ERROR(towers_->AllocateFrom(allocator));
    }
  }
  for (size_t i = 0; i < towers_->variables().size(); ++i) {
    tensors_.parameters.push_back(towers_->HostParameter(i));
    tensors_.gradients.push_back(towers_->HostGradient(i));
    tensors_.names.push_back(towers_->variables()[i].name);
  }
  // Every worker offers the same seeded values; the first to arrive wins, so
  // the job does not depend on the chief being first or alive.
  PST_ASSIGN_OR_RETURN(bool accepted, session_->Init([this, seed = training.seed()] {
    return towers_->InitialValues(seed);
  }));
  spdlog::info("worker:{} registered: {} mode, {} worker(s), {} shard(s), model {} parameters{}",
               rank_, ModeName(view.mode()), view.workers(), client_->num_shards(),
               towers_->num_parameters(), accepted ? " (initialized the variables)" : "");
  resume_clock_ = view.worker_clock();
  if (resume_clock_ > 0) {
    spdlog::info("worker:{} rejoins after {} steps: resuming at version {}", rank_, resume_clock_,
                 view.version());
  }
  report_.progress = std::make_unique<Progress>(
      report_.live && Progress::IsTerminal(), sampler_->steps_per_epoch() * training.epochs(),
      towers_->DevicesLabel());
  report_.recorder = std::make_unique<RunRecorder>(is_chief() ? report_.events : nullptr);
  return absl::OkStatus();
}

absl::Status Trainer::PullParameters() {
  PST_RETURN_IF_ERROR(towers_->PrepareHostParametersForWrite());
  PST_RETURN_IF_ERROR(session_->Exchange({.values = &tensors_.parameters}));
  return towers_->UploadParameters();
}

absl::Status Trainer::RunEpoch(int epoch, int64_t first_step, WorkerResult* result) {
  const TrainingConfig& training = config_.training();
  const int batch = training.batch_size();
  const int64_t steps = sampler_->steps_per_epoch();
  const int log_every = training.log_every_steps();
  double epoch_loss = 0.0;
  double window_loss = 0.0;
  absl::Time epoch_start = absl::Now();
  absl::Time window_start = epoch_start;
  for (int64_t step = first_step; step < steps; ++step) {
    const absl::Time step_start = absl::Now();
    absl::StatusOr<LossResult> loss;
    // A shard that went away (crashed, restarting from its checkpoint) or
    // refused for now (busy, lost the region) is waited for with backoff;
    // the step is then redone on whatever the shard holds.
    int tries = 0;
    PST_RETURN_IF_ERROR(session_->Redo([&] {
      if (tries++ > 0) exchange_.reset();  // cancelled: the shards' state is read afresh
      loss = training.exchange() == LAYERWISE ? RunStepLayerwise(epoch, step)
                                              : RunStep(epoch, step);
      return loss.status();
    }));
    session_->CountStep(step_start, batch);
    epoch_loss += loss->loss;
    window_loss += loss->loss;
    result->set_steps(result->steps() + 1);
    result->set_samples(result->samples() + batch);
    const bool window_end = (step + 1) % log_every == 0 || step + 1 == steps;
    const int64_t in_window = std::min<int64_t>((step % log_every) + 1, step - first_step + 1);
    if (window_end || report_.progress->live()) {
      ProgressPoint point{epoch, training.epochs(), step + 1, steps, window_loss / in_window,
                          in_window * batch / SecondsSince(window_start),
                          session_->versions()[0]};
      report_.progress->Report(point, epoch * steps + step + 1);
    }
    if (window_end) {
      RecordGradientNorms(tensors_.names, tensors_.gradients);
      report_.recorder->OnWindow({epoch * steps + step + 1, window_loss / in_window,
                                  in_window * batch / SecondsSince(window_start),
                                  static_cast<double>(session_->TakeStaleness()) / in_window,
                                  session_->versions()[0]},
                                 result);
      window_loss = 0.0;
      window_start = absl::Now();
    }
  }
  // The epoch's last exchange: its values are the model the epoch ends with.
  PST_RETURN_IF_ERROR(session_->Redo([&] {
    return exchange_ != nullptr ? FinishExchange(/*upload=*/true) : PullParametersIfDue();
  }));
  report_.train_seconds += SecondsSince(epoch_start);
  report_.last_epoch_loss = epoch_loss / std::max<int64_t>(1, steps - first_step);
  report_.progress->Finish();
  return absl::OkStatus();
}

absl::Status Trainer::PullParametersIfDue() {
  return session_->parameters_current() ? absl::OkStatus() : PullParameters();
}

absl::StatusOr<LossResult> Trainer::RunStep(int epoch, int64_t step) {
  PST_RETURN_IF_ERROR(PullParametersIfDue());
  const int batch = config_.training().batch_size();
  const Dataset& train = data_->train;
  staging_.gather.Wait();
  absl::StatusOr<LossResult> loss;
  if (staging_.gathered == std::make_pair(epoch, step)) {
    loss = towers_->ComputeGradients(staging_.x.data(), staging_.y.data(), batch);
  } else {
    const std::span<const int64_t> rows = sampler_->Batch(epoch, step);
    loss = towers_->ComputeGradients(
        staging_.x.data(), staging_.y.data(), batch, [&](int first, int count) {
          GatherBatch(train, rows.subspan(first, count),
                      staging_.x.data() + static_cast<size_t>(first) * train.feature_dim,
                      staging_.y.data() + static_cast<size_t>(first) * train.target_dim);
        });
  }
  staging_.gathered = {-1, -1};
  if (!loss.ok()) return loss;
  if (before_push_) before_push_();
  // The gradient goes out and the next step's parameters come back in one
  // exchange (PsClient::PushPull).
  PST_RETURN_IF_ERROR(towers_->PrepareHostParametersForWrite());
  if (towers_->ComputesOnHostMemory() && step + 1 < sampler_->steps_per_epoch()) {
    const std::span<const int64_t> next_rows = sampler_->Batch(epoch, step + 1);
    staging_.gathered = {epoch, step + 1};
    staging_.gather = staging_.thread.Start(
        [&train, next_rows, x = staging_.x.data(), y = staging_.y.data()] {
          GatherBatch(train, next_rows, x, y);
        });
  }
  PST_RETURN_IF_ERROR(
      session_->Exchange({.gradients = &tensors_.gradients, .values = &tensors_.parameters}));
  PST_RETURN_IF_ERROR(towers_->UploadParameters());
  return loss;
}

absl::StatusOr<LossResult> Trainer::RunStepLayerwise(int epoch, int64_t step) {
  if (exchange_ == nullptr) PST_RETURN_IF_ERROR(PullParametersIfDue());
  const int batch = config_.training().batch_size();
  GatherBatch(data_->train, sampler_->Batch(epoch, step), staging_.x.data(), staging_.y.data());
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
          PST_RETURN_IF_ERROR(FinishExchange(/*upload=*/false));
          if (before_push_) before_push_();
          // The exchange writes the next values into the host parameters.
          PST_RETURN_IF_ERROR(towers_->PrepareHostParametersForWrite());
          PST_ASSIGN_OR_RETURN(pushing,
                               session_->BeginExchange(tensors_.gradients, tensors_.push_order,
                                                       tensors_.parameters));
        }
        return pushing->Push(towers_->LayerVariables(layer));
      }};
  absl::StatusOr<LossResult> loss =
      towers_->ComputeGradients(staging_.x.data(), staging_.y.data(), batch, hooks);
  if (!loss.ok()) {
    // A failed exchange may have written part of the parameters.
    exchange_.reset();
    return loss;
  }
  exchange_ = std::move(pushing);
  return loss;
}

absl::Status Trainer::FinishExchange(bool upload) {
  if (exchange_ == nullptr) return absl::OkStatus();
  PST_RETURN_IF_ERROR(session_->FinishExchange(std::move(exchange_)));
  return upload ? towers_->UploadParameters() : absl::OkStatus();
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
    PST_ASSIGN_OR_RETURN(LossResult part, towers_->Evaluate(x.data(), y.data(), rows));
    total.loss += part.loss * rows;
    total.correct += part.correct;
  }
  total.loss /= static_cast<double>(data.size);
  return total;
}

absl::Status Trainer::ExportModel() {
  const std::string& path = config_.training().export_model();
  if (path.empty()) return absl::OkStatus();
  std::vector<NpzArray> arrays;
  for (size_t i = 0; i < towers_->variables().size(); ++i) {
    const VariableSpec& spec = towers_->variables()[i];
    arrays.push_back(Float32Array(spec.name, spec.shape, tensors_.parameters[i]));
  }
  if (absl::Status s = WriteNpz(path, arrays); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("training.export_model: ", s.message()));
  }
  spdlog::info("wrote the final model to {} ({} variables)", path, arrays.size());
  return absl::OkStatus();
}

absl::Status Trainer::EvaluateFinal(WorkerResult* result) {
  PST_ASSIGN_OR_RETURN(WorkersAtEnd workers, session_->AwaitWorkersDone());
  const CheckpointStats& restored = workers.stats.checkpoint();
  if (result->steps() == 0 && workers.stats.pushes_applied() == 0 &&
      workers.stats.pushes_aggregated() == 0 && restored.restored_version() >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no training happened: ps:0 restored version ", restored.restored_version(),
        ", where every worker had already done its steps (a finished run); to train again, "
        "start the PS with --checkpoint_start=fresh"));
  }
  PST_RETURN_IF_ERROR(PullParameters());
  PST_RETURN_IF_ERROR(ExportModel());
  PST_ASSIGN_OR_RETURN(LossResult test, Evaluate(data_->test));
  result->set_test_loss(test.loss);
  const int epochs = config_.training().epochs();
  report_.recorder->OnEvaluation(epochs, epochs * sampler_->steps_per_epoch(), test.loss,
                                 Accuracy(test, data_->test), result);
  std::vector<std::string> missing;
  for (int worker : workers.missing) {
    result->add_missing_workers(worker);
    missing.push_back(absl::StrCat("worker:", worker));
  }
  const std::string without =
      missing.empty() ? ""
                      : absl::StrCat(" (without ", absl::StrJoin(missing, ", "),
                                     ": gone for good, neither done nor back within "
                                     "training.pull_timeout_seconds)");
  const int64_t version = session_->versions()[0];
  if (data_->test.num_classes > 0) {
    result->set_has_test_accuracy(true);
    result->set_test_accuracy(static_cast<double>(test.correct) / data_->test.size);
    spdlog::info("final: version {} test_accuracy {:.4f} test_loss {:.4f}{}", version,
                 result->test_accuracy(), test.loss, without);
  } else {
    spdlog::info("final: version {} test_loss {:.6f}{}", version, test.loss, without);
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
  return Train(std::move(result));
}

absl::StatusOr<WorkerResult> Trainer::Train(WorkerResult result) {
  const int epochs = config_.training().epochs();
  const int64_t steps = sampler_->steps_per_epoch();
  for (int epoch = static_cast<int>(resume_clock_ / steps); epoch < epochs; ++epoch) {
    const int64_t first_step = epoch == resume_clock_ / steps ? resume_clock_ % steps : 0;
    PST_RETURN_IF_ERROR(RunEpoch(epoch, first_step, &result));
    if (is_chief() && epoch + 1 < epochs) {
      // Evaluate the model as it stands after this epoch's last step.
      PST_RETURN_IF_ERROR(PullParameters());
      absl::Time start = absl::Now();
      PST_ASSIGN_OR_RETURN(LossResult test, Evaluate(data_->test));
      report_.recorder->OnEvaluation(epoch + 1, (epoch + 1) * steps, test.loss,
                                     Accuracy(test, data_->test), &result);
      spdlog::info("epoch {}/{} done: train_loss {:.4f} test_loss {:.4f}{} ({:.1f} s to evaluate)",
                   epoch + 1, epochs, report_.last_epoch_loss, test.loss,
                   data_->test.num_classes > 0
                       ? absl::StrCat(" test_accuracy ",
                                      absl::StrFormat("%.4f", static_cast<double>(test.correct) /
                                                                  data_->test.size))
                       : std::string(),
                   SecondsSince(start));
    }
  }
  result.set_train_seconds(report_.train_seconds);
  result.set_final_loss(report_.last_epoch_loss);
  PST_RETURN_IF_ERROR(session_->Finish());
  if (is_chief()) {
    PST_RETURN_IF_ERROR(EvaluateFinal(&result));
  }
  result.set_final_version(session_->versions()[0]);
  return result;
}

}  // namespace pst
