#include "worker/model/ctr_model.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pst {

absl::Status PrepareCtrInput(const CtrBatch& batch, const CtrModelSpec& spec,
                             CtrStepInput* input) {
  if (batch.num_fields != spec.num_fields || batch.dense_dim != spec.dense_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", batch.num_fields, " fields and ", batch.dense_dim,
        " dense features for a model of ", spec.num_fields, " and ", spec.dense_dim));
  }
  absl::flat_hash_map<uint64_t, int32_t> slot_of;
  slot_of.reserve(batch.ids.size());
  input->unique_ids.clear();
  EmbeddingBags& deep = input->deep;
  deep.pooling = spec.pooling;
  deep.offsets = batch.offsets;
  deep.weights = batch.values;
  deep.slots.resize(batch.ids.size());
  for (size_t e = 0; e < batch.ids.size(); ++e) {
    auto [it, added] =
        slot_of.try_emplace(batch.ids[e], static_cast<int32_t>(input->unique_ids.size()));
    if (added) input->unique_ids.push_back(batch.ids[e]);
    deep.slots[e] = it->second;
  }
  deep.num_rows = static_cast<int>(input->unique_ids.size());
  deep.bags_per_row = spec.num_fields;
  deep.row_stride = spec.input_dim();
  PST_RETURN_IF_ERROR(deep.Finish(spec.embedding_dim));
  if (!spec.wide) return absl::OkStatus();
  EmbeddingBags& wide = input->wide;
  wide.pooling = PoolingKind::kSum;
  wide.num_rows = deep.num_rows;
  wide.slots = deep.slots;
  wide.weights = deep.weights;
  wide.offsets.resize(static_cast<size_t>(batch.size()) + 1);
  for (int example = 0; example <= batch.size(); ++example) {
    wide.offsets[example] = batch.offsets[static_cast<size_t>(example) * spec.num_fields];
  }
  wide.bags_per_row = 1;
  wide.row_stride = 1;
  return wide.Finish(1);
}

CtrModel::CtrModel(CtrModelSpec spec, Kernels* kernels, int max_batch)
    : spec_(std::move(spec)), kernels_(kernels), max_batch_(max_batch) {}

CtrModel::~CtrModel() {
  for (float* buffer : {wide_logits_, rows_, row_grads_, wide_rows_, wide_grads_}) {
    if (buffer != nullptr) kernels_->Free(buffer);
  }
}

absl::StatusOr<std::unique_ptr<CtrModel>> CtrModel::Create(const CtrModelSpec& spec,
                                                           Kernels* kernels, int max_batch) {
  if (spec.num_fields < 1 || spec.embedding_dim < 1 || spec.dense_dim < 0) {
    return absl::InvalidArgumentError(
        "a CTR model needs at least 1 categorical field and an embedding dim of at least 1");
  }
  std::unique_ptr<CtrModel> model(new CtrModel(spec, kernels, max_batch));
  MlpSpec mlp;
  mlp.input_dim = spec.input_dim();
  mlp.hidden = spec.hidden;
  mlp.output_dim = 1;
  mlp.activation = spec.activation;
  mlp.loss = LossKind::kSigmoidCrossEntropy;
  mlp.input_gradient = true;
  PST_ASSIGN_OR_RETURN(model->mlp_, Mlp::Create(mlp, kernels, max_batch));
  if (spec.wide) {
    PST_ASSIGN_OR_RETURN(model->wide_logits_, kernels->Allocate(static_cast<size_t>(max_batch)));
    model->mlp_->set_output_offset(model->wide_logits_);
  }
  return model;
}

absl::StatusOr<float*> CtrModel::Staged(float** buffer, size_t* capacity, size_t count) {
  if (count > *capacity) {
    if (*buffer != nullptr) kernels_->Free(*buffer);
    *buffer = nullptr;
    *capacity = 0;
    // Room to grow, so that batches of a few more ids do not reallocate.
    const size_t size = std::max<size_t>(count + count / 2, 1024);
    PST_ASSIGN_OR_RETURN(*buffer, kernels_->Allocate(size));
    *capacity = size;
  }
  return *buffer;
}

absl::Status CtrModel::CheckShapes(const CtrBatch& batch, const CtrStepInput& input,
                                   std::span<const float> rows,
                                   std::span<const float> wide_rows) const {
  const size_t unique = input.unique_ids.size();
  if (batch.size() < 1 || batch.size() > max_batch_ || input.deep.num_bags() !=
      batch.size() * spec_.num_fields) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", batch.size(), " examples, prepared for ",
        input.deep.num_bags() / spec_.num_fields, ", for a model of batches up to ", max_batch_));
  }
  if (rows.size() != unique * spec_.embedding_dim ||
      wide_rows.size() != (spec_.wide ? unique : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        rows.size(), " embedding and ", wide_rows.size(), " wide values for ", unique,
        " ids of dim ", spec_.embedding_dim, spec_.wide ? " and 1" : " (no wide part)"));
  }
  return absl::OkStatus();
}

absl::Status CtrModel::QueueInput(const CtrBatch& batch, const CtrStepInput& input,
                                  std::span<const float> rows, std::span<const float> wide_rows) {
  PST_RETURN_IF_ERROR(CheckShapes(batch, input, rows, wide_rows));
  const int input_dim = spec_.input_dim();
  const int pooled = spec_.num_fields * spec_.embedding_dim;
  // The dense features go into their columns of the staged input rows; the
  // pooled columns are then written where the backend computes.
  std::span<float> staging = mlp_->HostInput();
  for (int example = 0; example < batch.size(); ++example) {
    std::copy_n(batch.dense.begin() + static_cast<ptrdiff_t>(example) * spec_.dense_dim,
                spec_.dense_dim, staging.begin() + static_cast<ptrdiff_t>(example) * input_dim + pooled);
  }
  float* x = mlp_->DeviceInput();
  PST_RETURN_IF_ERROR(
      kernels_->CopyToDevice(staging.data(), x, static_cast<size_t>(batch.size()) * input_dim));
  const float* device_rows = rows.data();
  const float* device_wide = wide_rows.data();
  if (!kernels_->ComputesOnHostMemory()) {
    PST_ASSIGN_OR_RETURN(float* staged_rows, Staged(&rows_, &rows_capacity_, rows.size()));
    PST_RETURN_IF_ERROR(kernels_->CopyToDevice(rows.data(), staged_rows, rows.size()));
    device_rows = staged_rows;
    if (spec_.wide) {
      PST_ASSIGN_OR_RETURN(float* staged_wide,
                           Staged(&wide_rows_, &wide_rows_capacity_, wide_rows.size()));
      PST_RETURN_IF_ERROR(kernels_->CopyToDevice(wide_rows.data(), staged_wide, wide_rows.size()));
      device_wide = staged_wide;
    }
  }
  PST_RETURN_IF_ERROR(
      kernels_->EmbeddingBagsForward(input.deep, spec_.embedding_dim, device_rows, x));
  if (spec_.wide) {
    PST_RETURN_IF_ERROR(kernels_->EmbeddingBagsForward(input.wide, 1, device_wide, wide_logits_));
  }
  return absl::OkStatus();
}

absl::StatusOr<LossResult> CtrModel::ComputeGradients(const CtrBatch& batch,
                                                      const CtrStepInput& input,
                                                      std::span<const float> rows,
                                                      std::span<const float> wide_rows,
                                                      std::span<float> row_grads,
                                                      std::span<float> wide_grads) {
  if (row_grads.size() != rows.size() || wide_grads.size() != wide_rows.size()) {
    return absl::InvalidArgumentError("row gradients must be shaped like the rows");
  }
  PST_RETURN_IF_ERROR(QueueInput(batch, input, rows, wide_rows));
  PST_RETURN_IF_ERROR(
      mlp_->QueueGradients(mlp_->DeviceInput(), batch.labels.data(), batch.size()));
  const bool on_host = kernels_->ComputesOnHostMemory();
  float* device_grads = row_grads.data();
  if (!on_host) {
    PST_ASSIGN_OR_RETURN(device_grads, Staged(&row_grads_, &row_grads_capacity_, row_grads.size()));
  }
  PST_RETURN_IF_ERROR(kernels_->EmbeddingBagsBackward(input.deep, spec_.embedding_dim,
                                                      mlp_->DeviceInputGradient(), device_grads));
  // The caller's spans are not pinned memory: these copies wait (CopyToHost).
  if (!on_host) {
    PST_RETURN_IF_ERROR(kernels_->CopyToHost(device_grads, row_grads.data(), row_grads.size()));
  }
  if (spec_.wide) {
    float* device_wide_grads = wide_grads.data();
    if (!on_host) {
      PST_ASSIGN_OR_RETURN(device_wide_grads,
                           Staged(&wide_grads_, &wide_grads_capacity_, wide_grads.size()));
    }
    PST_RETURN_IF_ERROR(kernels_->EmbeddingBagsBackward(input.wide, 1,
                                                        mlp_->DeviceOutputGradient(),
                                                        device_wide_grads));
    if (!on_host) {
      PST_RETURN_IF_ERROR(
          kernels_->CopyToHost(device_wide_grads, wide_grads.data(), wide_grads.size()));
    }
  }
  return mlp_->FinishGradients();
}

absl::StatusOr<LossResult> CtrModel::Evaluate(const CtrBatch& batch, const CtrStepInput& input,
                                              std::span<const float> rows,
                                              std::span<const float> wide_rows,
                                              std::span<float> probabilities) {
  if (probabilities.size() != static_cast<size_t>(batch.size())) {
    return absl::InvalidArgumentError("one probability per example");
  }
  PST_RETURN_IF_ERROR(QueueInput(batch, input, rows, wide_rows));
  PST_ASSIGN_OR_RETURN(LossResult loss,
                       mlp_->Evaluate(mlp_->DeviceInput(), batch.labels.data(), batch.size()));
  PST_ASSIGN_OR_RETURN(std::vector<float> logits, mlp_->LastOutput(batch.size()));
  for (int i = 0; i < batch.size(); ++i) {
    probabilities[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(logits[i]))));
  }
  return loss;
}

}  // namespace pst
