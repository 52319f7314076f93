// A multilayer perceptron trained through a Kernels backend.
//
// Variables, in order, for layer l = 0..L-1 (L = hidden layers + 1):
//   "dense_<l>/kernel"  shape [in_l, out_l]
//   "dense_<l>/bias"    shape [out_l]          (absent with use_bias = false)
// Hidden layers apply the activation; the output layer is linear and feeds
// the loss (softmax cross-entropy over classes, or mean squared error).
//
// Parameters and gradients are exchanged through host buffers the Mlp owns
// (from Kernels::AllocateHost: pinned memory on a GPU): call
// PrepareHostParametersForWrite(), write pulled values into HostParameter(i),
// call UploadParameters(), run ComputeGradients(), then read HostGradient(i).
// A step waits for the device once: forward, backward and the gradients'
// copies to the host are queued in order, then one wait, then the loss is
// read.
#ifndef PST_WORKER_MODEL_MLP_H_
#define PST_WORKER_MODEL_MLP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "placement/variable_spec.h"
#include "worker/model/tensor_allocator.h"

namespace pst {

// kSigmoidCrossEntropy: one output, a logit, against 0/1 labels (a click model).
enum class LossKind { kSoftmaxCrossEntropy, kMeanSquaredError, kSigmoidCrossEntropy };

struct MlpSpec {
  int input_dim = 0;
  std::vector<int> hidden;  // empty = linear model
  int output_dim = 0;       // number of classes for cross-entropy
  ActivationKind activation = ActivationKind::kRelu;
  LossKind loss = LossKind::kSoftmaxCrossEntropy;
  bool use_bias = true;
  // Also compute d(loss)/d(input) in the backward pass (DeviceInputGradient),
  // for a model whose input is itself trained (pooled embeddings).
  bool input_gradient = false;
};

class Mlp {
 public:
  // `kernels` must outlive the Mlp. Buffers for batches of up to `max_batch`
  // rows are allocated here, once. InvalidArgument for a bad spec.
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(const MlpSpec& spec, Kernels* kernels,
                                                     int max_batch);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const MlpSpec& spec() const { return spec_; }
  const std::vector<VariableSpec>& variables() const { return variables_; }
  const Kernels& backend() const { return *kernels_; }
  int64_t num_parameters() const;

  // Deterministic initial values from `seed`: Glorot-uniform kernels (He
  // scaling for ReLU), zero biases. One vector per variable, in order.
  std::vector<std::vector<float>> InitialValues(uint64_t seed) const;

  // Valid to write only between PrepareHostParametersForWrite() and the next
  // UploadParameters().
  std::span<float> HostParameter(size_t index);
  std::span<const float> HostGradient(size_t index) const;

  // Host staging for a batch ([max_batch, input_dim] features and
  // [max_batch] class indices or [max_batch, output_dim] targets). Any host
  // memory may be passed to ComputeGradients/Evaluate; these (pinned on a
  // GPU) upload fastest. Do not overwrite them while a call using them runs.
  std::span<float> HostInput() { return host_input_; }
  std::span<float> HostTargets() { return host_targets_; }

  // Queues the copy of every HostParameter to the backend. On a GPU the copy
  // runs after this returns, reading the host buffers as it goes: they must
  // not change until PrepareHostParametersForWrite() says so.
  absl::Status UploadParameters();

  // Makes this model's layers compute with `source`'s parameters instead of
  // its own (both on backends that compute on host memory, same shape), so
  // CPU towers share one copy: HostParameter(i) is then source's, and
  // UploadParameters copies nothing. `source` must outlive this model.
  absl::Status ReadParametersOf(const Mlp& source);

  // Makes this model's passes keep their activations and output gradients
  // in rows [first_row, first_row + max_batch) of `source`'s (both on
  // backends that compute on host memory, same shape), so that CPU towers
  // on consecutive slices of a batch leave each layer's rows as one matrix
  // in `source` (worker/model/towers.h). `source` must outlive this model
  // and not run a pass at the same time as it over those rows.
  // InvalidArgument unless `source` has room for the rows.
  absl::Status ComputeInRowsOf(Mlp& source, int first_row);

  // Moves the model's parameters and gradients into memory `allocator`
  // gives (worker/model/tensor_allocator.h), one call per variable, and computes
  // there from then on: HostParameter and HostGradient are that memory.
  // FailedPrecondition on a backend that does not compute on host memory;
  // InvalidArgument, with nothing moved, for memory of another size; an
  // allocator's failure is passed on.
  absl::Status AllocateFrom(TensorAllocator& allocator);

  // AllocateFrom with the memory at hand: the layers compute on
  // `parameters` and leave their gradients in `gradients` (one span per
  // variable, sized like it; none keeps the model's own gradient buffers),
  // the parameters' values copied there. The same refusals.
  absl::Status PlaceTensors(std::span<const std::span<float>> parameters,
                            std::span<const std::span<float>> gradients);

  // Waits until no queued copy still reads the HostParameter buffers (those
  // of the last UploadParameters, and nothing queued after them), so they
  // may be rewritten. Cheap when the copy is done; call it before every
  // write into HostParameter spans, however they were obtained.
  absl::Status PrepareHostParametersForWrite();

  // Forward + backward on `batch` rows. `x` is [batch, input_dim];
  // `targets` is [batch] class indices (cross-entropy) or [batch, output_dim]
  // (MSE), host memory. Leaves d(mean loss)/d(variable) in HostGradient.
  absl::StatusOr<LossResult> ComputeGradients(const float* x, const float* targets, int batch);

  // What a caller overlapping communication with computation is told, layer
  // by layer (layer l holds variables LayerVariables(l)). An error from a
  // hook ends the pass with that error.
  struct LayerHooks {
    // Before layer l's forward: return once the layer's HostParameters hold
    // the values to compute with; the Mlp then uploads that layer alone.
    std::function<absl::Status(int layer)> parameters_needed;
    // After layer l's backward, last layer first: the layer's HostGradients
    // are final, and the pass no longer reads the layer's parameters.
    std::function<absl::Status(int layer)> gradients_ready;
  };
  // ComputeGradients with the upload and download done layer by layer
  // around `hooks` (so no UploadParameters is needed before it).
  absl::StatusOr<LossResult> ComputeGradients(const float* x, const float* targets, int batch,
                                              const LayerHooks& hooks);
  int num_layers() const;
  // The variables of layer l, in variable order (its kernel, then its bias).
  std::vector<int> LayerVariables(int layer) const;

  // For models on the CPU that compute one batch's kernel gradients
  // together, each a range of the columns from every model's rows
  // (worker/model/towers.h). Backward, layer l, last first: the bias
  // gradient is computed, output_gradient_ready(l) is called once
  // LayerOutputGradient(l) is final, the gradient below is computed, then
  // kernel_gradient(l), which leaves the layer's kernel gradient wherever
  // its caller keeps it: this model's own HostGradient of the kernel is not
  // written. The pass reads nothing the hooks write.
  struct SharedKernelGradients {
    std::function<void(int layer)> output_gradient_ready;
    std::function<absl::Status(int layer)> kernel_gradient;
  };
  absl::StatusOr<LossResult> ComputeGradients(const float* x, const float* targets, int batch,
                                              const SharedKernelGradients& shared);
  // Of the last pass, in backend memory, unchanged until the next pass:
  // layer l's input [batch, in_l] (for layer 0 the pass's `x` itself, which
  // the caller keeps) and d(loss)/d(its output before the activation)
  // [batch, out_l].
  const float* LayerInput(int layer) const;
  const float* LayerOutputGradient(int layer) const;

  // ComputeGradients in two halves: the forward + backward pass, waited for
  // and leaving the gradients in backend buffers, and their copy into
  // HostGradient (one more wait). Apart for gpu_bench, which times the
  // device work alone.
  absl::StatusOr<LossResult> ComputeDeviceGradients(const float* x, const float* targets,
                                                    int batch);
  absl::Status DownloadGradients();

  // ComputeGradients in two halves, for a caller that queues work of its own
  // on the backend before the step's one wait: the forward and backward
  // passes and the gradients' copies to HostGradient, queued; then the wait
  // and the loss.
  absl::Status QueueGradients(const float* x, const float* targets, int batch);
  absl::StatusOr<LossResult> FinishGradients();

  // The model's input in backend memory ([max_batch, input_dim]). Passed as
  // `x`, it is computed on where it lies, not copied: a caller may build the
  // input there with kernels of its own.
  float* DeviceInput() { return device_x_; }
  // Backend memory [max_batch, output_dim] added to the output before the
  // loss on every pass (the wide part of a wide & deep model); null = none.
  // Must outlive its use.
  void set_output_offset(const float* offset) { output_offset_ = offset; }
  // After a gradient pass, in backend memory: d(loss)/d(output) [batch,
  // output_dim] (also the offset's gradient), and with spec.input_gradient,
  // d(loss)/d(input) [batch, input_dim].
  const float* DeviceOutputGradient() const;
  const float* DeviceInputGradient() const { return input_grad_; }

  // Forward only, same inputs; no gradients.
  absl::StatusOr<LossResult> Evaluate(const float* x, const float* targets, int batch);

  // Host copy of the model output for the last Evaluate/ComputeGradients
  // batch ([batch, output_dim] logits or predictions).
  absl::StatusOr<std::vector<float>> LastOutput(int batch);

 private:
  Mlp(MlpSpec spec, Kernels* kernels, int max_batch);
  absl::Status AllocateBuffers();
  // Queue the work; nothing here waits for the backend.
  absl::Status Forward(const float* x, const float* targets, int batch, bool want_gradient,
                       const LayerHooks* hooks = nullptr);
  absl::Status Backward(const float* x, int batch, const LayerHooks* hooks = nullptr,
                        const SharedKernelGradients* shared = nullptr);
  absl::Status QueueGradientDownloads();
  // The step's one wait, then the loss its Forward queued.
  absl::StatusOr<LossResult> SynchronizeAndTakeLoss();

  struct Layer;
  absl::Status UploadLayer(const Layer& layer);
  absl::Status QueueLayerDownload(const Layer& layer);
  absl::Status DownloadLayer(const Layer& layer);  // queued, then waited for
  MlpSpec spec_;
  Kernels* kernels_;
  int max_batch_;
  std::vector<VariableSpec> variables_;
  std::vector<Layer> layers_;
  std::vector<std::span<float>> host_params_;  // from kernels_->AllocateHost
  std::vector<std::span<float>> host_grads_;   // from kernels_->AllocateHost
  std::span<float> host_input_;                // from kernels_->AllocateHost
  std::span<float> host_targets_;              // from kernels_->AllocateHost
  float* device_x_ = nullptr;
  const float* pass_input_ = nullptr;  // the pass's x: device_x_, or x itself on the CPU
  float* device_targets_ = nullptr;
  float* input_grad_ = nullptr;         // [max_batch, input_dim] with spec.input_gradient
  const float* output_offset_ = nullptr;
  std::vector<float*> owned_;       // every device buffer, freed in the destructor
  std::vector<float*> owned_host_;  // every host buffer, freed in the destructor
  std::unique_ptr<QueueMarker> upload_done_;  // recorded after each parameter upload
};

}  // namespace pst

#endif  // PST_WORKER_MODEL_MLP_H_
