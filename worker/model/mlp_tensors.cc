// Where an Mlp's tensors live: another tower's parameters read in place,
// an allocator's memory (a co-located shard's region), or spans the caller
// places.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/mlp.h"
#include "worker/model/mlp_layer.h"

namespace pst {

absl::Status Mlp::ReadParametersOf(const Mlp& source) {
  if (!kernels_->ComputesOnHostMemory() || !source.kernels_->ComputesOnHostMemory()) {
    return absl::FailedPreconditionError(
        "only models on backends that compute on host memory can share parameters");
  }
  if (source.variables_.size() != variables_.size() || source.layers_.size() != layers_.size()) {
    return absl::InvalidArgumentError("cannot share the parameters of a model of another shape");
  }
  for (size_t i = 0; i < variables_.size(); ++i) {
    if (source.variables_[i].shape != variables_[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot share the parameters of a model of another shape: ", variables_[i].name));
    }
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].weights = source.layers_[l].weights;
    layers_[l].bias = source.layers_[l].bias;
  }
  host_params_ = source.host_params_;
  return absl::OkStatus();
}

absl::Status Mlp::ComputeInRowsOf(Mlp& source, int first_row) {
  if (!kernels_->ComputesOnHostMemory() || !source.kernels_->ComputesOnHostMemory()) {
    return absl::FailedPreconditionError(
        "only models on backends that compute on host memory can share rows");
  }
  if (source.layers_.size() != layers_.size() || source.spec_.input_dim != spec_.input_dim) {
    return absl::InvalidArgumentError("cannot compute in the rows of a model of another shape");
  }
  if (first_row < 0 || first_row + max_batch_ > source.max_batch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", first_row, ", ", first_row + max_batch_,
                     ") are outside the source model's ", source.max_batch_));
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (source.layers_[l].out != layers_[l].out) {
      return absl::InvalidArgumentError("cannot compute in the rows of a model of another shape");
    }
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const size_t offset = static_cast<size_t>(first_row) * layers_[l].out;
    layers_[l].output = source.layers_[l].output + offset;
    layers_[l].output_grad = source.layers_[l].output_grad + offset;
  }
  return absl::OkStatus();
}

absl::Status Mlp::AllocateFrom(TensorAllocator& allocator) {
  if (!kernels_->ComputesOnHostMemory()) {
    return absl::FailedPreconditionError(
        "only a model on a backend that computes on host memory can compute in place");
  }
  std::vector<std::span<float>> parameters, gradients;
  for (size_t i = 0; i < variables_.size(); ++i) {
    PST_ASSIGN_OR_RETURN(TensorAllocator::Memory memory,
                         allocator.Allocate(static_cast<int>(i), variables_[i]));
    parameters.push_back(memory.values);
    gradients.push_back(memory.gradient);
  }
  return PlaceTensors(parameters, gradients);
}

absl::Status Mlp::PlaceTensors(std::span<const std::span<float>> parameters,
                               std::span<const std::span<float>> gradients) {
  if (!kernels_->ComputesOnHostMemory()) {
    return absl::FailedPreconditionError(
        "only a model on a backend that computes on host memory can compute in place");
  }
  auto check = [&](std::span<const std::span<float>> spans) -> absl::Status {
    if (spans.size() != variables_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(spans.size(), " spans for a model of ",
                                                     variables_.size(), " variables"));
    }
    for (size_t i = 0; i < variables_.size(); ++i) {
      if (static_cast<int64_t>(spans[i].size()) != variables_[i].size()) {
        return absl::InvalidArgumentError(absl::StrCat("a span of ", spans[i].size(),
                                                       " floats for ", variables_[i].name,
                                                       ", which has ", variables_[i].size()));
      }
    }
    return absl::OkStatus();
  };
  PST_RETURN_IF_ERROR(check(parameters));
  if (!gradients.empty()) {
    PST_RETURN_IF_ERROR(check(gradients));
  }
  for (size_t i = 0; i < variables_.size(); ++i) {
    std::copy(host_params_[i].begin(), host_params_[i].end(), parameters[i].begin());
    host_params_[i] = parameters[i];
    if (!gradients.empty()) host_grads_[i] = gradients[i];
  }
  for (Layer& layer : layers_) {
    layer.weights = host_params_[layer.weights_var].data();
    layer.weights_grad = host_grads_[layer.weights_var].data();
    if (layer.bias_var >= 0) {
      layer.bias = host_params_[layer.bias_var].data();
      layer.bias_grad = host_grads_[layer.bias_var].data();
    }
  }
  return absl::OkStatus();
}

}  // namespace pst
