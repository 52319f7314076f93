#include "worker/model/mlp.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/mlp_layer.h"

namespace pst {


Mlp::Mlp(MlpSpec spec, Kernels* kernels, int max_batch)
    : spec_(std::move(spec)), kernels_(kernels), max_batch_(max_batch) {}

Mlp::~Mlp() {
  for (float* buffer : owned_) kernels_->Free(buffer);
  for (float* buffer : owned_host_) kernels_->FreeHost(buffer);
}

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(const MlpSpec& spec, Kernels* kernels,
                                                 int max_batch) {
  if (spec.input_dim <= 0 || spec.output_dim <= 0) {
    return absl::InvalidArgumentError("an MLP needs input and output dimensions of at least 1");
  }
  for (int width : spec.hidden) {
    if (width <= 0) return absl::InvalidArgumentError("hidden layer widths must be at least 1");
  }
  if (spec.loss == LossKind::kSoftmaxCrossEntropy && spec.output_dim < 2) {
    return absl::InvalidArgumentError("softmax cross-entropy needs at least 2 classes");
  }
  if (spec.loss == LossKind::kSigmoidCrossEntropy && spec.output_dim != 1) {
    return absl::InvalidArgumentError("sigmoid cross-entropy needs exactly 1 output");
  }
  if (max_batch <= 0) return absl::InvalidArgumentError("max_batch must be at least 1");
  std::unique_ptr<Mlp> mlp(new Mlp(spec, kernels, max_batch));
  PST_RETURN_IF_ERROR(mlp->AllocateBuffers());
  return mlp;
}

absl::Status Mlp::AllocateBuffers() {
  std::vector<int> widths = {spec_.input_dim};
  widths.insert(widths.end(), spec_.hidden.begin(), spec_.hidden.end());
  widths.push_back(spec_.output_dim);
  auto allocate = [this](size_t count) -> absl::StatusOr<float*> {
    absl::StatusOr<float*> buffer = kernels_->Allocate(count);
    if (buffer.ok()) owned_.push_back(*buffer);
    return buffer;
  };
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    Layer layer;
    layer.in = widths[l];
    layer.out = widths[l + 1];
    const size_t w_size = static_cast<size_t>(layer.in) * layer.out;
    const size_t act_size = static_cast<size_t>(max_batch_) * layer.out;
    for (auto [target, count] : {std::pair{&layer.weights, w_size},
                                 std::pair{&layer.weights_grad, w_size},
                                 std::pair{&layer.output, act_size},
                                 std::pair{&layer.output_grad, act_size}}) {
      PST_ASSIGN_OR_RETURN(*target, allocate(count));
    }
    layer.weights_var = static_cast<int>(variables_.size());
    variables_.push_back({absl::StrCat("dense_", l, "/kernel"), {layer.in, layer.out}});
    if (spec_.use_bias) {
      for (float** target : {&layer.bias, &layer.bias_grad}) {
        PST_ASSIGN_OR_RETURN(*target, allocate(layer.out));
      }
      layer.bias_var = static_cast<int>(variables_.size());
      variables_.push_back({absl::StrCat("dense_", l, "/bias"), {layer.out}});
    }
    layers_.push_back(layer);
  }
  PST_ASSIGN_OR_RETURN(device_x_, allocate(static_cast<size_t>(max_batch_) * spec_.input_dim));
  if (spec_.input_gradient) {
    PST_ASSIGN_OR_RETURN(input_grad_, allocate(static_cast<size_t>(max_batch_) * spec_.input_dim));
  }
  const int target_width = spec_.loss == LossKind::kSoftmaxCrossEntropy ? 1 : spec_.output_dim;
  PST_ASSIGN_OR_RETURN(device_targets_, allocate(static_cast<size_t>(max_batch_) * target_width));
  auto allocate_host = [this](size_t count) -> absl::StatusOr<std::span<float>> {
    absl::StatusOr<float*> buffer = kernels_->AllocateHost(count);
    if (!buffer.ok()) return buffer.status();
    owned_host_.push_back(*buffer);
    std::fill(*buffer, *buffer + count, 0.0f);
    return std::span<float>(*buffer, count);
  };
  if (kernels_->ComputesOnHostMemory()) {
    // The backend computes on host memory: the host parameters and
    // gradients are the layers' own buffers, so uploads and downloads copy
    // nothing.
    host_params_.resize(variables_.size());
    host_grads_.resize(variables_.size());
    for (const Layer& layer : layers_) {
      host_params_[layer.weights_var] = {layer.weights, static_cast<size_t>(layer.in) * layer.out};
      host_grads_[layer.weights_var] = {layer.weights_grad,
                                        static_cast<size_t>(layer.in) * layer.out};
      if (layer.bias_var >= 0) {
        host_params_[layer.bias_var] = {layer.bias, static_cast<size_t>(layer.out)};
        host_grads_[layer.bias_var] = {layer.bias_grad, static_cast<size_t>(layer.out)};
      }
    }
  } else {
    for (const VariableSpec& v : variables_) {
      for (std::vector<std::span<float>>* spans : {&host_params_, &host_grads_}) {
        PST_ASSIGN_OR_RETURN(spans->emplace_back(), allocate_host(static_cast<size_t>(v.size())));
      }
    }
  }
  PST_ASSIGN_OR_RETURN(upload_done_, kernels_->NewMarker());
  if (kernels_->ComputesOnHostMemory()) {  // batches are computed on where they are staged
    host_input_ = {device_x_, static_cast<size_t>(max_batch_) * spec_.input_dim};
    host_targets_ = {device_targets_, static_cast<size_t>(max_batch_) * target_width};
    return absl::OkStatus();
  }
  PST_ASSIGN_OR_RETURN(host_input_,
                       allocate_host(static_cast<size_t>(max_batch_) * spec_.input_dim));
  PST_ASSIGN_OR_RETURN(host_targets_,
                       allocate_host(static_cast<size_t>(max_batch_) * target_width));
  return absl::OkStatus();
}

int64_t Mlp::num_parameters() const {
  int64_t n = 0;
  for (const VariableSpec& v : variables_) n += v.size();
  return n;
}

std::vector<std::vector<float>> Mlp::InitialValues(uint64_t seed) const {
  // Raw 64-bit draws mapped by hand: std::uniform_real_distribution's output
  // differs between standard libraries, and every process must agree.
  std::mt19937_64 rng(seed);
  auto uniform = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  std::vector<std::vector<float>> values;
  for (const Layer& layer : layers_) {
    // He-uniform ahead of a ReLU, Glorot-uniform otherwise.
    const bool feeds_relu =
        spec_.activation == ActivationKind::kRelu && &layer != &layers_.back();
    const double limit = feeds_relu ? std::sqrt(6.0 / layer.in)
                                    : std::sqrt(6.0 / (layer.in + layer.out));
    std::vector<float> weights(static_cast<size_t>(layer.in) * layer.out);
    for (float& w : weights) w = static_cast<float>((2.0 * uniform() - 1.0) * limit);
    values.push_back(std::move(weights));
    if (layer.bias_var >= 0) values.emplace_back(layer.out, 0.0f);
  }
  return values;
}

std::span<float> Mlp::HostParameter(size_t index) { return host_params_[index]; }

std::span<const float> Mlp::HostGradient(size_t index) const { return host_grads_[index]; }

absl::Status Mlp::UploadParameters() {
  for (const Layer& layer : layers_) {
    PST_RETURN_IF_ERROR(UploadLayer(layer));
  }
  return upload_done_->Record();
}

absl::Status Mlp::UploadLayer(const Layer& layer) {
  std::span<const float> w = host_params_[layer.weights_var];
  PST_RETURN_IF_ERROR(kernels_->CopyToDevice(w.data(), layer.weights, w.size()));
  if (layer.bias_var >= 0) {
    std::span<const float> b = host_params_[layer.bias_var];
    PST_RETURN_IF_ERROR(kernels_->CopyToDevice(b.data(), layer.bias, b.size()));
  }
  return absl::OkStatus();
}

int Mlp::num_layers() const { return static_cast<int>(layers_.size()); }

std::vector<int> Mlp::LayerVariables(int layer) const {
  const Layer& l = layers_[layer];
  if (l.bias_var < 0) return {l.weights_var};
  return {l.weights_var, l.bias_var};
}

absl::Status Mlp::PrepareHostParametersForWrite() { return upload_done_->Wait(); }

absl::Status Mlp::Forward(const float* x, const float* targets, int batch, bool want_gradient,
                          const LayerHooks* hooks) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " rows is outside [1, ", max_batch_, "]"));
  }
  const bool classify = spec_.loss == LossKind::kSoftmaxCrossEntropy;
  const size_t target_count = static_cast<size_t>(batch) * (classify ? 1 : spec_.output_dim);
  // A backend on host memory computes on the batch where it lies.
  pass_input_ = kernels_->ComputesOnHostMemory() ? x : device_x_;
  if (x != pass_input_) {
    PST_RETURN_IF_ERROR(
        kernels_->CopyToDevice(x, device_x_, static_cast<size_t>(batch) * spec_.input_dim));
  }
  if (absl::Status s = kernels_->CopyToDevice(targets, device_targets_, target_count); !s.ok()) {
    return s;
  }
  const float* input = pass_input_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    if (hooks != nullptr) {
      PST_RETURN_IF_ERROR(hooks->parameters_needed(static_cast<int>(l)));
      PST_RETURN_IF_ERROR(UploadLayer(layer));
      PST_RETURN_IF_ERROR(upload_done_->Record());
    }
    if (absl::Status s = kernels_->Gemm(false, false, batch, layer.out, layer.in, 1.0f, input,
                                        layer.weights, 0.0f, layer.output);
        !s.ok()) {
      return s;
    }
    if (layer.bias != nullptr) {
      if (absl::Status s = kernels_->AddBias(batch, layer.out, layer.bias, layer.output); !s.ok()) {
        return s;
      }
    }
    if (l + 1 < layers_.size()) {
      if (absl::Status s = kernels_->ActivationForward(
              spec_.activation, static_cast<size_t>(batch) * layer.out, layer.output);
          !s.ok()) {
        return s;
      }
    }
    input = layer.output;
  }
  Layer& last = layers_.back();
  if (output_offset_ != nullptr) {  // one "bias" row as long as the whole output
    PST_RETURN_IF_ERROR(kernels_->AddBias(1, batch * last.out, output_offset_, last.output));
  }
  float* dlogits = want_gradient ? last.output_grad : nullptr;
  if (spec_.loss == LossKind::kSigmoidCrossEntropy) {
    return kernels_->SigmoidCrossEntropy(batch, last.output, device_targets_, dlogits);
  }
  return classify ? kernels_->SoftmaxCrossEntropy(batch, last.out, last.output, device_targets_,
                                                  dlogits)
                  : kernels_->MeanSquaredError(batch, last.out, last.output, device_targets_,
                                               dlogits);
}

absl::Status Mlp::Backward(const float* x, int batch, const LayerHooks* hooks,
                           const SharedKernelGradients* shared) {
  for (size_t l = layers_.size(); l-- > 0;) {
    Layer& layer = layers_[l];
    const float* input = l == 0 ? x : layers_[l - 1].output;
    // dW = input^T dZ; db = column sums of dZ.
    if (shared == nullptr) {
      if (absl::Status s = kernels_->Gemm(true, false, layer.in, layer.out, batch, 1.0f, input,
                                          layer.output_grad, 0.0f, layer.weights_grad);
          !s.ok()) {
        return s;
      }
    }
    if (layer.bias_grad != nullptr) {
      if (absl::Status s = kernels_->ColumnSums(batch, layer.out, layer.output_grad, layer.bias_grad);
          !s.ok()) {
        return s;
      }
    }
    if (shared != nullptr) shared->output_gradient_ready(static_cast<int>(l));
    if (l > 0) {
      // d input = dZ W^T, then through the previous layer's activation.
      Layer& below = layers_[l - 1];
      if (absl::Status s = kernels_->Gemm(false, true, batch, layer.in, layer.out, 1.0f,
                                          layer.output_grad, layer.weights, 0.0f,
                                          below.output_grad);
          !s.ok()) {
        return s;
      }
      if (absl::Status s = kernels_->ActivationBackward(spec_.activation,
                                                        static_cast<size_t>(batch) * below.out,
                                                        below.output, below.output_grad);
          !s.ok()) {
        return s;
      }
    } else if (input_grad_ != nullptr) {
      PST_RETURN_IF_ERROR(kernels_->Gemm(false, true, batch, layer.in, layer.out, 1.0f,
                                         layer.output_grad, layer.weights, 0.0f, input_grad_));
    }
    if (shared != nullptr) PST_RETURN_IF_ERROR(shared->kernel_gradient(static_cast<int>(l)));
    // The layer's gradients are final and its weights no longer read.
    if (hooks != nullptr) {
      PST_RETURN_IF_ERROR(DownloadLayer(layer));
      PST_RETURN_IF_ERROR(hooks->gradients_ready(static_cast<int>(l)));
    }
  }
  return absl::OkStatus();
}

absl::Status Mlp::QueueLayerDownload(const Layer& layer) {
  std::span<float> w = host_grads_[layer.weights_var];
  if (absl::Status s = kernels_->CopyToHostAsync(layer.weights_grad, w.data(), w.size()); !s.ok()) {
    return s;
  }
  if (layer.bias_var >= 0) {
    std::span<float> b = host_grads_[layer.bias_var];
    if (absl::Status s = kernels_->CopyToHostAsync(layer.bias_grad, b.data(), b.size()); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Mlp::DownloadLayer(const Layer& layer) {
  PST_RETURN_IF_ERROR(QueueLayerDownload(layer));
  return kernels_->Synchronize();
}

absl::Status Mlp::QueueGradientDownloads() {
  for (const Layer& layer : layers_) {
    PST_RETURN_IF_ERROR(QueueLayerDownload(layer));
  }
  return absl::OkStatus();
}

absl::Status Mlp::DownloadGradients() {
  PST_RETURN_IF_ERROR(QueueGradientDownloads());
  return kernels_->Synchronize();
}

absl::StatusOr<LossResult> Mlp::SynchronizeAndTakeLoss() {
  PST_RETURN_IF_ERROR(kernels_->Synchronize());
  return kernels_->TakeLoss();
}

absl::StatusOr<LossResult> Mlp::ComputeGradients(const float* x, const float* targets, int batch) {
  PST_RETURN_IF_ERROR(QueueGradients(x, targets, batch));
  return FinishGradients();
}

absl::Status Mlp::QueueGradients(const float* x, const float* targets, int batch) {
  PST_RETURN_IF_ERROR(Forward(x, targets, batch, /*want_gradient=*/true));
  PST_RETURN_IF_ERROR(Backward(pass_input_, batch));
  return QueueGradientDownloads();
}

absl::StatusOr<LossResult> Mlp::FinishGradients() { return SynchronizeAndTakeLoss(); }

const float* Mlp::DeviceOutputGradient() const { return layers_.back().output_grad; }

absl::StatusOr<LossResult> Mlp::ComputeGradients(const float* x, const float* targets, int batch,
                                                 const LayerHooks& hooks) {
  if (absl::Status s = Forward(x, targets, batch, /*want_gradient=*/true, &hooks); !s.ok()) {
    return s;
  }
  PST_RETURN_IF_ERROR(Backward(pass_input_, batch, &hooks));
  return SynchronizeAndTakeLoss();  // the layers' downloads have waited already
}

absl::StatusOr<LossResult> Mlp::ComputeGradients(const float* x, const float* targets, int batch,
                                                 const SharedKernelGradients& shared) {
  if (!kernels_->ComputesOnHostMemory()) {
    return absl::FailedPreconditionError(
        "only models on backends that compute on host memory share kernel gradients");
  }
  PST_RETURN_IF_ERROR(Forward(x, targets, batch, /*want_gradient=*/true));
  PST_RETURN_IF_ERROR(Backward(pass_input_, batch, nullptr, &shared));
  for (const Layer& layer : layers_) {
    if (layer.bias_var < 0) continue;
    std::span<float> b = host_grads_[layer.bias_var];
    PST_RETURN_IF_ERROR(kernels_->CopyToHostAsync(layer.bias_grad, b.data(), b.size()));
  }
  return SynchronizeAndTakeLoss();
}

const float* Mlp::LayerInput(int layer) const {
  return layer == 0 ? pass_input_ : layers_[layer - 1].output;
}

const float* Mlp::LayerOutputGradient(int layer) const { return layers_[layer].output_grad; }

absl::StatusOr<LossResult> Mlp::ComputeDeviceGradients(const float* x, const float* targets,
                                                       int batch) {
  PST_RETURN_IF_ERROR(Forward(x, targets, batch, /*want_gradient=*/true));
  PST_RETURN_IF_ERROR(Backward(pass_input_, batch));
  return SynchronizeAndTakeLoss();
}

absl::StatusOr<LossResult> Mlp::Evaluate(const float* x, const float* targets, int batch) {
  PST_RETURN_IF_ERROR(Forward(x, targets, batch, /*want_gradient=*/false));
  return SynchronizeAndTakeLoss();
}

absl::StatusOr<std::vector<float>> Mlp::LastOutput(int batch) {
  if (batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch, " rows is outside [1, ", max_batch_, "]"));
  }
  const Layer& last = layers_.back();
  std::vector<float> out(static_cast<size_t>(batch) * last.out);
  PST_RETURN_IF_ERROR(kernels_->CopyToHost(last.output, out.data(), out.size()));
  return out;
}

}  // namespace pst
