// Towers: in-graph replication of the model over a worker's local devices
// (TensorFlow's multi-GPU tower averaging). Each tower is an Mlp on its own
// backend; a step splits the batch into equal slices, every tower runs
// forward and backward on its slice on its own thread, and the towers'
// gradients are averaged on the host in tower order, so the worker pushes
// one gradient. Averaging equal-slice means gives the gradient of the whole
// batch, so one worker with T towers of b/T rows trains like one device
// with b rows (to rounding), deterministically.
//
// The average runs on the host, also for GPU towers: the gradient must
// reach host memory to be pushed anyway, so reducing there costs no extra
// transfer, needs no peer access between the GPUs, and keeps one summation
// order whatever the topology.
//
// CPU towers share memory, so they average no kernel gradients: the towers
// keep their activations and output gradients in consecutive rows of tower
// 0's buffers, and once every tower's output gradient of a layer is final,
// each tower's thread computes a range of the kernel gradient's columns
// from the whole batch's rows in one product, straight into the pushed
// gradient. That is the average of per-tower gradients to rounding (one
// sum over the batch's rows instead of one per slice), the same every
// run, without per-tower gradients to zero, write and read back; only the
// biases are averaged.
#ifndef PST_WORKER_MODEL_TOWERS_H_
#define PST_WORKER_MODEL_TOWERS_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "worker/model/mlp.h"
#include "worker/model/tensor_allocator.h"

namespace pst {

class Towers {
 public:
  // One tower per backend, in order (borrowed; they must outlive the
  // Towers). `batch` is the worker's batch, which must divide evenly among
  // the towers; tower 0 also evaluates, in batches of up to `eval_batch`.
  static absl::StatusOr<std::unique_ptr<Towers>> Create(const MlpSpec& spec,
                                                        const std::vector<Kernels*>& backends,
                                                        int batch, int eval_batch);

  int size() const { return static_cast<int>(towers_.size()); }
  // Where the towers compute: "cpu", "cpu:2", "cuda:0,cuda:1".
  std::string DevicesLabel() const;
  Mlp& tower(int t) { return *towers_[t]; }
  const std::vector<VariableSpec>& variables() const { return towers_[0]->variables(); }
  int64_t num_parameters() const { return towers_[0]->num_parameters(); }
  std::vector<std::vector<float>> InitialValues(uint64_t seed) const {
    return towers_[0]->InitialValues(seed);
  }

  // Where the worker writes pulled parameters (tower 0's host buffers);
  // UploadParameters hands them to every tower.
  std::span<float> HostParameter(size_t index) { return towers_[0]->HostParameter(index); }
  absl::Status UploadParameters();
  // Waits until no queued upload still reads the host parameters
  // (Mlp::PrepareHostParametersForWrite): call before writing into them.
  absl::Status PrepareHostParametersForWrite();

  // The averaged gradient of the last ComputeGradients.
  std::span<const float> HostGradient(size_t index) const {
    return size() == 1 ? towers_[0]->HostGradient(index) : std::span<const float>(averaged_[index]);
  }

  // Whether every tower computes on host memory (the CPU), so AllocateFrom
  // may be used.
  bool ComputesOnHostMemory() const { return shared_parameters_; }
  // Moves HostParameter(i) and HostGradient(i) into memory `allocator`
  // gives (worker/model/tensor_allocator.h), one call per variable, the current
  // parameter values copied there: the towers compute with those
  // parameters (Mlp::AllocateFrom), and the averaged gradient (or the one
  // tower's) is left in that gradient memory. FailedPrecondition unless
  // ComputesOnHostMemory(); InvalidArgument, with nothing moved, for
  // memory of another size; an allocator's failure is passed on.
  absl::Status AllocateFrom(TensorAllocator& allocator);

  // Host staging for a whole batch (tower 0's, pinned on a GPU).
  std::span<float> HostInput() { return towers_[0]->HostInput(); }
  std::span<float> HostTargets() { return towers_[0]->HostTargets(); }

  // Forward + backward of `batch` rows (the batch Create was given), tower
  // t on rows [t * batch / T, (t + 1) * batch / T), then the average. The
  // loss is the mean over the batch; correct counts every row.
  absl::StatusOr<LossResult> ComputeGradients(const float* x, const float* targets, int batch);

  // ComputeGradients where each tower's thread first fills its own rows:
  // fill_rows(first, count) must write rows [first, first + count) of the
  // batch into `x` and `targets`, so the towers gather their slices in
  // parallel instead of the caller gathering the whole batch before them.
  // fill_rows is called from every tower's thread at once, on disjoint rows.
  using FillRows = absl::FunctionRef<void(int first, int count)>;
  absl::StatusOr<LossResult> ComputeGradients(const float* x, const float* targets, int batch,
                                              FillRows fill_rows);

  // ComputeGradients with Mlp's layer hooks (worker/model/mlp.h), for a caller
  // that overlaps the exchange with computation: parameters_needed(l) is
  // called from every tower before it computes layer l, gradients_ready(l)
  // once per layer, when every tower is done with it and the layer's
  // average is in HostGradient (last layer first).
  absl::StatusOr<LossResult> ComputeGradients(const float* x, const float* targets, int batch,
                                              const Mlp::LayerHooks& hooks);
  int num_layers() const { return towers_[0]->num_layers(); }
  std::vector<int> LayerVariables(int layer) const { return towers_[0]->LayerVariables(layer); }

  // Forward only, on tower 0.
  absl::StatusOr<LossResult> Evaluate(const float* x, const float* targets, int batch) {
    return towers_[0]->Evaluate(x, targets, batch);
  }

 private:
  Towers() = default;
  // Runs fn(t) for every tower, tower 0 on the calling thread and the others
  // on kept threads; returns the first failure in tower order.
  absl::Status ForEachTower(const std::function<absl::Status(int)>& fn);
  // averaged_ = the mean of every tower's gradients, summed in tower order,
  // for the given variables.
  void AverageGradients(const std::vector<int>& variables);
  // The same for elements [begin, end) of variable i.
  void AverageRange(int i, size_t begin, size_t end);
  // The forward and backward of every tower on its slice; without hooks,
  // then the average.
  absl::StatusOr<LossResult> ComputeSlices(const float* x, const float* targets, int batch,
                                           const Mlp::LayerHooks* hooks,
                                           const FillRows* fill_rows = nullptr);
  // Tower t's forward and backward on its slice of `slice` rows, with layer
  // hooks or shared kernel gradients (at most one).
  absl::Status ComputeSlice(int t, const float* x, const float* targets, int slice,
                            const Mlp::LayerHooks* hooks,
                            const Mlp::SharedKernelGradients* shared, LossResult* result);
  // The slices of CPU towers, their kernel gradients computed together.
  absl::StatusOr<LossResult> ComputeSlicesSharingKernelGradients(const float* x,
                                                                 const float* targets, int slice,
                                                                 const FillRows* fill_rows);
  // Tower t's share of layer l's kernel gradient: its range of the columns,
  // from the `batch` rows of every tower's last pass.
  absl::Status KernelGradientColumns(int t, int layer, int batch);
  // Tower 0's host values of `variables` into tower t's (towers that keep
  // their own parameters), once tower t's last upload has read them.
  absl::Status CopyParameters(int t, const std::vector<int>& variables);

  std::vector<std::unique_ptr<Mlp>> towers_;
  std::vector<Kernels*> backends_;  // towers_[t] computes on backends_[t]
  int slice_rows_ = 0;              // rows per tower of the batch Create was given
  // Per variable, with several towers: the average, in averaged_memory_ or
  // in memory from AllocateFrom's allocator.
  std::vector<std::span<float>> averaged_;
  std::vector<std::vector<float>> averaged_memory_;
  std::vector<int> all_variables_;            // 0, 1, ..., variables - 1
  bool shared_parameters_ = false;  // towers 1.. compute with tower 0's parameters
  int input_dim_ = 0;
  int target_width_ = 0;  // floats per row of targets
  ThreadPool threads_;
  absl::Mutex layers_mu_;
  std::vector<int> towers_left_ ABSL_GUARDED_BY(layers_mu_);  // per layer, in a hooked pass
};

}  // namespace pst

#endif  // PST_WORKER_MODEL_TOWERS_H_
