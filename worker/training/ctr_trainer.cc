#include "worker/training/ctr_trainer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/ctr_config.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "data/auc.h"
#include "spdlog/spdlog.h"
#include "worker/client/ps_client.h"
#include "worker/client/worker_metrics.h"
#include "worker/training/ctr_data.h"

namespace pst {
namespace {

// The chief evaluates the test file in batches of this many examples.
constexpr int kCtrEvalBatch = 1024;

}  // namespace

CtrModelSpec CtrModelSpecFor(const TrainingConfig& training) {
  const CtrModelConfig& ctr = training.model().ctr();
  const CtrShape shape = CtrShapeOf(training.dataset().ctr());
  CtrModelSpec spec;
  spec.num_fields = shape.fields;
  spec.dense_dim = shape.dense;
  for (const EmbeddingTableConfig& table : training.model().embeddings()) {
    if (table.name() == ctr.table()) spec.embedding_dim = table.dim();
  }
  spec.pooling = ctr.pooling() == POOLING_MEAN ? PoolingKind::kMean : PoolingKind::kSum;
  spec.wide = !ctr.wide_table().empty();
  spec.hidden.assign(ctr.hidden().begin(), ctr.hidden().end());
  spec.activation = ctr.activation() == TANH ? ActivationKind::kTanh : ActivationKind::kRelu;
  return spec;
}

CtrTrainer::CtrTrainer(const JobConfig& config, int rank, PsClient* client, Kernels* kernels,
                       std::optional<PlantedModel> planted)
    : config_(config), rank_(rank), client_(client), kernels_(kernels), planted_(planted) {}

absl::Status CtrTrainer::Setup() {
  const TrainingConfig& training = config_.training();
  const int workers = config_.cluster().workers();
  PST_ASSIGN_OR_RETURN(session_, TrainingSession::Create(config_, rank_, client_));
  const int batch = training.batch_size();
  PST_ASSIGN_OR_RETURN(model_, CtrModel::Create(CtrModelSpecFor(training), kernels_,
                                                std::max(batch, kCtrEvalBatch)));
  const CtrDataConfig& data = training.dataset().ctr();
  // Every worker counts every share, so all agree on the steps of an epoch
  // (SYNC needs the same number from each).
  PST_ASSIGN_OR_RETURN(std::vector<int64_t> shares,
                       CountShares(data.train_file(), ReaderOptionsFrom(data, 0, workers)));
  steps_per_epoch_ = *std::min_element(shares.begin(), shares.end()) / batch;
  if (steps_per_epoch_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.train_file(), " gives the smallest worker's share ",
        *std::min_element(shares.begin(), shares.end()), " examples, fewer than batch_size ", batch,
        "; lower batch_size or workers, or use a larger file"));
  }
  PST_ASSIGN_OR_RETURN(reader_,
                       CtrReader::Open(data.train_file(), ReaderOptionsFrom(data, rank_, workers)));

  Mlp& mlp = model_->mlp();
  client_->SetVariables(mlp.variables());
  PST_ASSIGN_OR_RETURN(CtrTables tables, CtrShardTables(training));
  client_->SetEmbeddingTables(std::move(tables.tables));
  deep_table_ = client_->FindEmbeddingTable(tables.deep);
  wide_table_ = tables.wide.empty() ? -1 : client_->FindEmbeddingTable(tables.wide);
  joint_ = tables.joint;
  if (joint_ && is_chief()) {
    spdlog::info(
        "tables {} and {} are fed the same ids and trained and stored alike: the shards keep "
        "them as one table, {}",
        training.model().ctr().table(), training.model().ctr().wide_table(), tables.deep);
  }
  PST_ASSIGN_OR_RETURN(RegisterResponse view, session_->Join());
  if (kernels_->ComputesOnHostMemory()) {
    PST_ASSIGN_OR_RETURN(PsClient::Tensors tensors, client_->AllocateTensors());
    PST_RETURN_IF_ERROR(mlp.PlaceTensors(tensors.values, tensors.gradients));
  }
  for (size_t i = 0; i < mlp.variables().size(); ++i) {
    parameters_.push_back(mlp.HostParameter(i));
    gradients_.push_back(mlp.HostGradient(i));
    variable_names_.push_back(mlp.variables()[i].name);
  }
  PST_ASSIGN_OR_RETURN(bool accepted, session_->Init([&mlp, seed = training.seed()] {
    return mlp.InitialValues(seed);
  }));
  spdlog::info("worker:{} registered: {} mode, {} worker(s), {} shard(s), CTR model of {} dense "
               "parameters, {} steps per epoch{}",
               rank_, ModeName(view.mode()), view.workers(), client_->num_shards(),
               mlp.num_parameters(), steps_per_epoch_,
               accepted ? " (initialized the variables)" : "");
  progress_ = std::make_unique<Progress>(live_progress_ && Progress::IsTerminal(),
                                         steps_per_epoch_ * training.epochs(), kernels_->Name());
  recorder_ = std::make_unique<RunRecorder>(is_chief() ? events_ : nullptr);
  if (view.worker_clock() > 0) {
    spdlog::info("worker:{} rejoins after {} steps; it trains its share from the first epoch "
                 "again, on the shards' model", rank_, view.worker_clock());
  }
  return absl::OkStatus();
}

absl::Status CtrTrainer::Fill(CtrReader* reader, int examples, Slot* slot) {
  slot->batch = EmptyBatchFor(ReaderOptionsFrom(config_.training().dataset().ctr(), 0, 1).format);
  PST_ASSIGN_OR_RETURN(int read, reader->Read(examples, &slot->batch));
  if (read == 0) return absl::OutOfRangeError("end of file");
  PST_RETURN_IF_ERROR(PrepareCtrInput(slot->batch, model_->spec(), &slot->input));
  const size_t unique = slot->input.unique_ids.size();
  const bool wide = model_->spec().wide;
  slot->rows.resize(unique * model_->spec().embedding_dim);
  slot->row_grads.resize(slot->rows.size());
  slot->wide.resize(wide ? unique : 0);
  slot->wide_grads.resize(slot->wide.size());
  if (joint_) {
    slot->joint_rows.resize(slot->rows.size() + slot->wide.size());
    slot->joint_grads.resize(slot->joint_rows.size());
    slot->values = {RowValues{deep_table_, slot->input.unique_ids, slot->joint_rows}};
    slot->gradients = {RowGradients{deep_table_, slot->input.unique_ids, slot->joint_grads}};
    return absl::OkStatus();
  }
  slot->values = {RowValues{deep_table_, slot->input.unique_ids, slot->rows}};
  slot->gradients = {RowGradients{deep_table_, slot->input.unique_ids, slot->row_grads}};
  if (wide) {
    slot->values.push_back(RowValues{wide_table_, slot->input.unique_ids, slot->wide});
    slot->gradients.push_back(RowGradients{wide_table_, slot->input.unique_ids, slot->wide_grads});
  }
  return absl::OkStatus();
}

void CtrTrainer::SplitJointRows(Slot& slot) const {
  if (!joint_) return;
  const size_t dim = model_->spec().embedding_dim;
  const float* joint = slot.joint_rows.data();
  for (size_t i = 0; i < slot.wide.size(); ++i, joint += dim + 1) {
    std::copy_n(joint, dim, &slot.rows[i * dim]);
    slot.wide[i] = joint[dim];
  }
}

void CtrTrainer::JoinGradients(Slot& slot) const {
  if (!joint_) return;
  const size_t dim = model_->spec().embedding_dim;
  float* joint = slot.joint_grads.data();
  for (size_t i = 0; i < slot.wide_grads.size(); ++i, joint += dim + 1) {
    std::copy_n(&slot.row_grads[i * dim], dim, joint);
    joint[dim] = slot.wide_grads[i];
  }
}

absl::Status CtrTrainer::RunEpoch(int epoch, WorkerResult* result) {
  const TrainingConfig& training = config_.training();
  const int batch = training.batch_size();
  const int log_every = training.log_every_steps();
  PST_RETURN_IF_ERROR(reader_->Rewind());
  auto filled = [&](Slot* slot) -> absl::Status {
    absl::Status s = Fill(reader_.get(), batch, slot);
    if (absl::IsOutOfRange(s) || (s.ok() && slot->batch.size() < batch)) {
      return absl::FailedPreconditionError(absl::StrCat(
          training.dataset().ctr().train_file(), " changed while training: this worker's share "
          "ended before step ", steps_per_epoch_, " of the epoch"));
    }
    return s;
  };
  PST_RETURN_IF_ERROR(filled(&slots_[0]));
  if (steps_per_epoch_ > 1) PST_RETURN_IF_ERROR(filled(&slots_[1]));
  // The batch after next, read beside the step; waited for before the
  // next step starts, and before this function returns (it uses `filled`).
  absl::Status read_ahead_status;
  ThreadPool::Task read_ahead;
  double epoch_loss = 0.0;
  double window_loss = 0.0;
  const absl::Time epoch_start = absl::Now();
  absl::Time window_start = epoch_start;
  for (int64_t step = 0; step < steps_per_epoch_; ++step) {
    const absl::Time step_start = absl::Now();
    Slot& current = slots_[step % 3];
    Slot* next = step + 1 < steps_per_epoch_ ? &slots_[(step + 1) % 3] : nullptr;
    Slot* after = step + 2 < steps_per_epoch_ ? &slots_[(step + 2) % 3] : nullptr;
    read_ahead.Wait();
    PST_RETURN_IF_ERROR(read_ahead_status);
    absl::StatusOr<LossResult> loss;
    // The epoch's first step reads its rows; a step redone after a refusal
    // reads the parameters and its rows again. The batch after next is
    // read once, whatever happens to this step.
    bool read_rows = step == 0;
    bool reading = false;
    auto read_after = [&] {
      if (after == nullptr || std::exchange(reading, true)) return;
      read_ahead = reader_thread_.Start([&, after] { read_ahead_status = filled(after); });
    };
    PST_RETURN_IF_ERROR(session_->Redo([&] {
      loss = RunStep(current, next, std::exchange(read_rows, true), read_after);
      return loss.status();
    }));
    session_->CountStep(step_start, batch);
    epoch_loss += loss->loss;
    window_loss += loss->loss;
    result->set_steps(result->steps() + 1);
    result->set_samples(result->samples() + batch);
    const bool window_end = (step + 1) % log_every == 0 || step + 1 == steps_per_epoch_;
    if (window_end || progress_->live()) {
      const int64_t in_window = (step % log_every) + 1;
      progress_->Report(
          {epoch, training.epochs(), step + 1, steps_per_epoch_, window_loss / in_window,
           in_window * batch / SecondsSince(window_start), session_->versions()[0]},
          epoch * steps_per_epoch_ + step + 1);
    }
    if (window_end) {
      const int64_t in_window = (step % log_every) + 1;
      RecordGradientNorms(variable_names_, gradients_);
      recorder_->OnWindow({epoch * steps_per_epoch_ + step + 1, window_loss / in_window,
                           in_window * batch / SecondsSince(window_start),
                           static_cast<double>(session_->TakeStaleness()) / in_window,
                           session_->versions()[0]},
                          result);
      window_loss = 0.0;
      window_start = absl::Now();
    }
  }
  train_seconds_ += SecondsSince(epoch_start);
  last_epoch_loss_ = epoch_loss / static_cast<double>(steps_per_epoch_);
  progress_->Finish();
  if (reader_->skipped() > 0) {
    spdlog::warn("worker:{} skipped {} malformed line(s) so far; the first: {}", rank_,
                 reader_->skipped(), reader_->first_skip());
  }
  return absl::OkStatus();
}

absl::StatusOr<LossResult> CtrTrainer::RunStep(Slot& current, Slot* next, bool read_rows,
                                               absl::FunctionRef<void()> before_exchange) {
  Mlp& mlp = model_->mlp();
  if (read_rows || !session_->parameters_current()) {
    PST_RETURN_IF_ERROR(mlp.PrepareHostParametersForWrite());
    PST_RETURN_IF_ERROR(session_->Exchange({.values = &parameters_, .pull_rows = current.values}));
    PST_RETURN_IF_ERROR(mlp.UploadParameters());
  }
  SplitJointRows(current);
  PST_ASSIGN_OR_RETURN(LossResult loss,
                       model_->ComputeGradients(current.batch, current.input, current.rows,
                                                current.wide, current.row_grads,
                                                current.wide_grads));
  JoinGradients(current);
  if (before_push_) before_push_();
  before_exchange();
  // Step s's gradients out, step s+1's rows and the parameters back.
  PST_RETURN_IF_ERROR(mlp.PrepareHostParametersForWrite());
  PST_RETURN_IF_ERROR(session_->Exchange(
      {.gradients = &gradients_,
       .push_rows = current.gradients,
       .values = &parameters_,
       .pull_rows = next != nullptr ? std::span<const RowValues>(next->values)
                                    : std::span<const RowValues>()}));
  PST_RETURN_IF_ERROR(mlp.UploadParameters());
  return loss;
}

absl::Status CtrTrainer::EvaluateFinal(WorkerResult* result) {
  const TrainingConfig& training = config_.training();
  PST_ASSIGN_OR_RETURN(WorkersAtEnd workers, session_->AwaitWorkersDone());
  Mlp& mlp = model_->mlp();
  PST_RETURN_IF_ERROR(mlp.PrepareHostParametersForWrite());
  PST_RETURN_IF_ERROR(session_->Exchange({.values = &parameters_}));
  PST_RETURN_IF_ERROR(mlp.UploadParameters());
  const CtrDataConfig& data = training.dataset().ctr();
  PST_ASSIGN_OR_RETURN(std::unique_ptr<CtrReader> test,
                       CtrReader::Open(data.test_file(), ReaderOptionsFrom(data, 0, 1)));
  std::vector<float> probabilities;
  std::vector<float> labels;
  std::vector<float> part;
  double loss_sum = 0.0;
  const absl::Time start = absl::Now();
  Slot& slot = slots_[0];
  while (true) {
    absl::Status filled = Fill(test.get(), kCtrEvalBatch, &slot);
    if (absl::IsOutOfRange(filled)) break;
    PST_RETURN_IF_ERROR(filled);
    PST_RETURN_IF_ERROR(session_->Exchange({.pull_rows = slot.values}));
    SplitJointRows(slot);
    part.resize(slot.batch.size());
    PST_ASSIGN_OR_RETURN(LossResult loss,
                         model_->Evaluate(slot.batch, slot.input, slot.rows, slot.wide, part));
    loss_sum += loss.loss * slot.batch.size();
    probabilities.insert(probabilities.end(), part.begin(), part.end());
    labels.insert(labels.end(), slot.batch.labels.begin(), slot.batch.labels.end());
  }
  if (labels.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(data.test_file(), " holds no example"));
  }
  const double logloss = loss_sum / static_cast<double>(labels.size());
  const double auc = Auc(probabilities, labels);
  result->set_has_test_auc(true);
  result->set_test_auc(auc);
  result->set_test_logloss(logloss);
  result->set_test_loss(logloss);
  if (planted_.has_value()) result->set_planted_auc(planted_->test_auc);
  recorder_->OnEvaluation(training.epochs(), training.epochs() * steps_per_epoch_, logloss,
                          std::nullopt, result);
  for (int worker : workers.missing) result->add_missing_workers(worker);
  spdlog::info("final: version {} test_auc {:.4f} test_logloss {:.4f} on {} examples ({:.1f} s){}",
               session_->versions()[0], auc, logloss, labels.size(), SecondsSince(start),
               planted_.has_value()
                   ? absl::StrCat("; the planted model scores test_auc ",
                                  absl::StrFormat("%.4f", planted_->test_auc), " test_logloss ",
                                  absl::StrFormat("%.4f", planted_->test_logloss))
                   : std::string());
  if (!workers.missing.empty() && training.require_all_workers()) {
    return absl::DeadlineExceededError(absl::StrCat(
        workers.missing.size(), " worker(s) did not finish, and training.require_all_workers "
        "is set"));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerResult> CtrTrainer::Run() {
  WorkerResult result;
  result.set_task(absl::StrCat("worker:", rank_));
  PST_RETURN_IF_ERROR(Setup());
  result.set_devices(kernels_->Name());
  if (planted_.has_value() && is_chief()) {
    spdlog::info("planted model on {}: test_auc {:.4f} test_logloss {:.4f} click_rate {:.4f}",
                 config_.training().dataset().ctr().test_file(), planted_->test_auc,
                 planted_->test_logloss, planted_->click_rate);
  }
  for (int epoch = 0; epoch < config_.training().epochs(); ++epoch) {
    PST_RETURN_IF_ERROR(RunEpoch(epoch, &result));
  }
  PST_RETURN_IF_ERROR(session_->Finish());
  if (is_chief()) PST_RETURN_IF_ERROR(EvaluateFinal(&result));
  result.set_train_seconds(train_seconds_);
  result.set_final_loss(last_epoch_loss_);
  result.set_final_version(session_->versions()[0]);
  return result;
}

}  // namespace pst
