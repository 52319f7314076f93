// The CUDA backend: cuBLAS for every matrix product, the small kernels of
// cuda_launch.cu for the rest, everything queued in call order on one
// non-blocking stream owned by this object.
//
// Row-major without copies: a row-major m x n matrix is, read column-major,
// its n x m transpose. So C = op(A) op(B) (row-major) is computed as the
// column-major product C^T = op(B)^T op(A)^T, i.e. cublasSgemm with the
// operands swapped and m, n exchanged; no data moves.
//
// Math: fp32 throughout, CUBLAS_DEFAULT_MATH (no TF32 tensor-core rounding),
// so results match the CPU reference to ~1e-6 relative; TF32 would trade
// that (to ~1e-3) for speed.
//
// Host synchronization happens only where the host asks for it: CopyToHost,
// Synchronize and QueueMarker::Wait. A loss call queues its 24-byte totals'
// copy into pinned memory, and TakeLoss reads them after the caller's wait.
// Device buffers are allocated by the caller once (Allocate); the scratch of
// the loss and column-sum reductions is allocated here, once, at
// construction.
#include <algorithm>
#include <climits>
#include <memory>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/column_major_gemm.h"
#include "kernels/column_sums.h"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/device.h"
#include "kernels/loss_slot.h"

namespace pst {
namespace {

// "<call>: <cudaErrorName>: <description>"; clears the runtime's last error
// so that a handled failure is not reported again by a later launch check.
absl::Status CudaStatus(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  std::string message =
      absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string message =
      absl::StrCat(call, ": ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CheckDims(absl::string_view op, std::initializer_list<int> dims) {
  for (int d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative dimension ", d));
  }
  return absl::OkStatus();
}

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(int device) : device_(device) {}

  ~CudaKernels() override {
    // Nothing to report to from a destructor; the calls release what they can.
    if (UseDevice().ok()) {
      if (stream_ != nullptr) cudaStreamSynchronize(stream_);
      if (cublas_ != nullptr) cublasDestroy(cublas_);
      if (partials_ != nullptr) cudaFree(partials_);
      if (column_scratch_ != nullptr) cudaFree(column_scratch_);
      if (bag_ints_ != nullptr) cudaFree(bag_ints_);
      if (bag_weights_ != nullptr) cudaFree(bag_weights_);
      if (totals_ != nullptr) cudaFree(totals_);
      if (host_totals_ != nullptr) cudaFreeHost(host_totals_);
      if (stream_ != nullptr) cudaStreamDestroy(stream_);
    }
    cudaGetLastError();
  }

  // Stream, cuBLAS handle (bound to the stream, default fp32 math) and the
  // loss scratch buffers.
  absl::Status Init() {
    PST_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    if (absl::Status s = CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;
    }
    PST_RETURN_IF_ERROR(CublasStatus(cublasCreate(&cublas_), "cublasCreate"));
    if (absl::Status s = CublasStatus(cublasSetStream(cublas_, stream_), "cublasSetStream");
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CublasStatus(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(
            cudaMalloc(reinterpret_cast<void**>(&partials_), sizeof(cuda::LossPartial) * cuda::kMaxLossBlocks),
            "cudaMalloc (loss partials)");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(cudaMalloc(reinterpret_cast<void**>(&column_scratch_),
                                               sizeof(float) * kColumnSumsScratch),
                                    "cudaMalloc (column sums scratch)");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(cudaMalloc(reinterpret_cast<void**>(&totals_), sizeof(cuda::LossTotals)),
                                    "cudaMalloc (loss totals)");
        !s.ok()) {
      return s;
    }
    return CudaStatus(cudaMallocHost(reinterpret_cast<void**>(&host_totals_), sizeof(cuda::LossTotals)),
                      "cudaMallocHost (loss totals)");
  }

  std::string Name() const override { return absl::StrCat("cuda:", device_); }

  absl::StatusOr<float*> Allocate(size_t count) override {
    PST_RETURN_IF_ERROR(UseDevice());
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(float);
    if (absl::Status s = CudaStatus(cudaMalloc(&p, bytes), absl::StrCat("cudaMalloc(", bytes, " bytes)"));
        !s.ok()) {
      return s;
    }
    return static_cast<float*>(p);
  }

  void Free(float* buffer) override {
    if (buffer == nullptr || !UseDevice().ok()) return;
    cudaFree(buffer);  // implicitly waits for queued work that may use it
    cudaGetLastError();
  }

  absl::StatusOr<float*> AllocateHost(size_t count) override {
    PST_RETURN_IF_ERROR(UseDevice());
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(float);
    if (absl::Status s =
            CudaStatus(cudaMallocHost(&p, bytes), absl::StrCat("cudaMallocHost(", bytes, " bytes)"));
        !s.ok()) {
      return s;
    }
    return static_cast<float*>(p);
  }

  void FreeHost(float* buffer) override {
    if (buffer == nullptr) return;
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // no copy may still read it
    cudaFreeHost(buffer);
    cudaGetLastError();
  }

  absl::Status CopyToDevice(const float* host, float* device, size_t count) override {
    if (count == 0) return absl::OkStatus();
    PST_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(cudaMemcpyAsync(device, host, count * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync (host to device)");
  }

  absl::Status CopyToHostAsync(const float* device, float* host, size_t count) override {
    if (count == 0) return absl::OkStatus();
    PST_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(cudaMemcpyAsync(host, device, count * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync (device to host)");
  }

  absl::Status Synchronize() override {
    PST_RETURN_IF_ERROR(UseDevice());
    absl::Status s = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (s.ok()) loss_slot_.Waited();
    return s;
  }

  absl::StatusOr<std::unique_ptr<QueueMarker>> NewMarker() override {
    PST_RETURN_IF_ERROR(UseDevice());
    cudaEvent_t event = nullptr;
    if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                    "cudaEventCreateWithFlags");
        !s.ok()) {
      return s;
    }
    return std::make_unique<EventMarker>(this, event);
  }

  absl::Status CopyToHost(const float* device, float* host, size_t count) override {
    PST_RETURN_IF_ERROR(CopyToHostAsync(device, host, count));
    return Synchronize();
  }

  absl::Status GemmStrided(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc) override {
    PST_RETURN_IF_ERROR(CheckDims("Gemm", {m, n, k}));
    if (!StridesCoverWidths(transpose_a, transpose_b, m, n, k, lda, ldb, ldc)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Gemm: a row stride narrower than its matrix (lda ", lda, ", ldb ", ldb,
                       ", ldc ", ldc, ")"));
    }
    if (m == 0 || n == 0) return absl::OkStatus();
    PST_RETURN_IF_ERROR(UseDevice());
    if (k == 0) return ScaleRows(m, n, beta, c, ldc);
    const ColumnMajorGemm call =
        ToColumnMajorGemm(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
    return CublasStatus(cublasSgemm(cublas_, call.transpose_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    call.transpose_second ? CUBLAS_OP_T : CUBLAS_OP_N, call.m,
                                    call.n, call.k, &alpha, b, call.ld_first, a, call.ld_second,
                                    &beta, c, call.ld_c),
                        "cublasSgemm");
  }

  absl::Status AddBias(int rows, int cols, const float* bias, float* y) override {
    PST_RETURN_IF_ERROR(CheckDims("AddBias", {rows, cols}));
    PST_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(cuda::LaunchAddBias(stream_, rows, cols, bias, y), "AddBias kernel launch");
  }

  absl::Status ActivationForward(ActivationKind kind, size_t count, float* y) override {
    PST_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(
        cuda::LaunchActivationForward(stream_, kind == ActivationKind::kTanh, count, y),
        "ActivationForward kernel launch");
  }

  absl::Status ActivationBackward(ActivationKind kind, size_t count, const float* y,
                                  float* dy) override {
    PST_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(
        cuda::LaunchActivationBackward(stream_, kind == ActivationKind::kTanh, count, y, dy),
        "ActivationBackward kernel launch");
  }

  absl::Status ColumnSums(int rows, int cols, const float* m, float* out) override {
    PST_RETURN_IF_ERROR(CheckDims("ColumnSums", {rows, cols}));
    PST_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(cuda::LaunchColumnSums(stream_, rows, cols, m, out, column_scratch_),
                      "ColumnSums kernel launch");
  }

  absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                   const float* labels, float* dlogits) override {
    if (rows <= 0 || classes <= 0) {
      loss_slot_.Clear();
      return absl::InvalidArgumentError("SoftmaxCrossEntropy needs rows and classes > 0");
    }
    return QueueLoss(
        PendingLoss{true, static_cast<double>(rows), classes},
        [&] {
          return cuda::LaunchSoftmaxCrossEntropy(stream_, rows, classes, logits, labels, dlogits,
                                                 partials_, totals_);
        },
        "SoftmaxCrossEntropy kernel launch");
  }

  absl::Status MeanSquaredError(int rows, int cols, const float* pred, const float* target,
                                float* dpred) override {
    if (rows <= 0 || cols <= 0) {
      loss_slot_.Clear();
      return absl::InvalidArgumentError("MeanSquaredError needs rows and cols > 0");
    }
    const size_t count = static_cast<size_t>(rows) * cols;
    return QueueLoss(
        PendingLoss{false, static_cast<double>(count), 0},
        [&] {
          return cuda::LaunchSquaredError(stream_, count, pred, target, dpred, partials_, totals_);
        },
        "MeanSquaredError kernel launch");
  }

  absl::Status SigmoidCrossEntropy(int rows, const float* logits, const float* labels,
                                   float* dlogits) override {
    if (rows <= 0) {
      loss_slot_.Clear();
      return absl::InvalidArgumentError("SigmoidCrossEntropy needs rows > 0");
    }
    // Counted like a classification (correct rows); its labels need no check.
    return QueueLoss(
        PendingLoss{true, static_cast<double>(rows), 2},
        [&] {
          return cuda::LaunchSigmoidCrossEntropy(stream_, rows, logits, labels, dlogits, partials_,
                                                 totals_);
        },
        "SigmoidCrossEntropy kernel launch");
  }

  absl::Status EmbeddingBagsForward(const EmbeddingBags& bags, int dim, const float* rows,
                                    float* out) override {
    PST_ASSIGN_OR_RETURN(cuda::DeviceBags device_bags, UploadBags(bags, dim));
    return CudaStatus(cuda::LaunchPoolBags(stream_, device_bags, dim, rows, out),
                      "EmbeddingBagsForward kernel launch");
  }

  absl::Status EmbeddingBagsBackward(const EmbeddingBags& bags, int dim, const float* out_grad,
                                     float* row_grads) override {
    PST_ASSIGN_OR_RETURN(cuda::DeviceBags device_bags, UploadBags(bags, dim));
    return CudaStatus(cuda::LaunchPoolBagsBackward(stream_, device_bags, dim, out_grad, row_grads),
                      "EmbeddingBagsBackward kernel launch");
  }

  absl::StatusOr<LossResult> TakeLoss() override {
    PST_RETURN_IF_ERROR(loss_slot_.Take());
    const cuda::LossTotals totals = *host_totals_;
    if (pending_.classify && totals.first_bad_row != INT_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("label ", totals.bad_label, " of row ",
                                                     totals.first_bad_row,
                                                     " is not a class index in [0, ",
                                                     pending_.classes, ")"));
    }
    return LossResult{totals.loss_sum / pending_.divisor, pending_.classify ? totals.correct : 0};
  }

 private:
  // A QueueMarker as a CUDA event on the backend's stream. A never-recorded
  // event counts as complete, so Wait() on it returns at once.
  class EventMarker final : public QueueMarker {
   public:
    EventMarker(const CudaKernels* kernels, cudaEvent_t event) : kernels_(kernels), event_(event) {}
    ~EventMarker() override {
      if (kernels_->UseDevice().ok()) cudaEventDestroy(event_);
      cudaGetLastError();
    }
    absl::Status Record() override {
      PST_RETURN_IF_ERROR(kernels_->UseDevice());
      return CudaStatus(cudaEventRecord(event_, kernels_->stream_), "cudaEventRecord");
    }
    absl::Status Wait() override {
      PST_RETURN_IF_ERROR(kernels_->UseDevice());
      return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
    }

   private:
    const CudaKernels* kernels_;
    cudaEvent_t event_;
  };

  // What TakeLoss needs to finish the queued loss's totals.
  struct PendingLoss {
    bool classify = false;  // softmax cross-entropy (labels checked, correct counted)
    double divisor = 1.0;   // rows, or elements for MSE
    int classes = 0;
  };

  // c = beta * c on m rows of n floats, ldc apart (a product over an empty
  // inner dimension), never reading c when beta == 0.
  absl::Status ScaleRows(int m, int n, float beta, float* c, int ldc) {
    if (beta == 0.0f) {
      return CudaStatus(cudaMemset2DAsync(c, static_cast<size_t>(ldc) * sizeof(float), 0,
                                          static_cast<size_t>(n) * sizeof(float), m, stream_),
                        "cudaMemset2DAsync");
    }
    if (ldc == n) {
      return CudaStatus(cuda::LaunchScale(stream_, static_cast<size_t>(m) * n, beta, c),
                        "Scale kernel launch");
    }
    for (int row = 0; row < m; ++row) {
      PST_RETURN_IF_ERROR(CudaStatus(
          cuda::LaunchScale(stream_, n, beta, c + static_cast<size_t>(row) * ldc),
          "Scale kernel launch"));
    }
    return absl::OkStatus();
  }

  // The worker may call from a thread other than the one that made this
  // object; the CUDA device is per host thread.
  absl::Status UseDevice() const {
    int current = -1;
    PST_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&current), "cudaGetDevice"));
    if (current == device_) return absl::OkStatus();
    return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  }

  // Queues the loss kernels and the copy of their 24-byte totals into pinned
  // host memory, where TakeLoss reads them after the next Synchronize. Only
  // one loss is in flight at a time: the totals buffers are single, and the
  // stream orders a later loss after this one's copy.
  // Queues the copy of `bags`' index arrays into the backend's scratch
  // buffers (grown, after a wait, when too small). The host arrays are
  // pageable, so the copy has staged them when cudaMemcpyAsync returns; a
  // later call's copy is ordered after the kernels that read this one.
  absl::StatusOr<cuda::DeviceBags> UploadBags(const EmbeddingBags& bags, int dim) {
    PST_RETURN_IF_ERROR(bags.CheckFinished(dim));
    PST_RETURN_IF_ERROR(UseDevice());
    const size_t entries = bags.slots.size();
    const size_t ints = bags.offsets.size() + bags.row_offsets.size() + 3 * entries;
    if (ints > bag_int_capacity_ || entries > bag_weight_capacity_) {
      PST_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
      if (ints > bag_int_capacity_) {
        if (bag_ints_ != nullptr) cudaFree(bag_ints_);
        bag_ints_ = nullptr;
        bag_int_capacity_ = 0;
        PST_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&bag_ints_),
                                                  sizeof(int) * std::max<size_t>(ints, 1)),
                                       "cudaMalloc (embedding bags)"));
        bag_int_capacity_ = ints;
      }
      if (entries > bag_weight_capacity_) {
        if (bag_weights_ != nullptr) cudaFree(bag_weights_);
        bag_weights_ = nullptr;
        bag_weight_capacity_ = 0;
        PST_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&bag_weights_),
                                                  sizeof(float) * std::max<size_t>(entries, 1)),
                                       "cudaMalloc (embedding bag weights)"));
        bag_weight_capacity_ = entries;
      }
    }
    int* next = bag_ints_;
    auto upload = [&](const std::vector<int32_t>& host) -> absl::StatusOr<const int*> {
      int* at = next;
      next += host.size();
      if (host.empty()) return at;
      PST_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(at, host.data(), sizeof(int) * host.size(),
                                                     cudaMemcpyHostToDevice, stream_),
                                     "cudaMemcpyAsync (embedding bags)"));
      return at;
    };
    cuda::DeviceBags device{};
    device.bags = bags.num_bags();
    device.rows = bags.num_rows;
    device.bags_per_row = bags.bags_per_row;
    device.row_stride = bags.row_stride > 0 ? bags.row_stride
                                            : static_cast<long long>(bags.bags_per_row) * dim;
    device.mean = bags.pooling == PoolingKind::kMean;
    PST_ASSIGN_OR_RETURN(device.offsets, upload(bags.offsets));
    PST_ASSIGN_OR_RETURN(device.slots, upload(bags.slots));
    PST_ASSIGN_OR_RETURN(device.row_offsets, upload(bags.row_offsets));
    PST_ASSIGN_OR_RETURN(device.row_entries, upload(bags.row_entries));
    PST_ASSIGN_OR_RETURN(device.entry_bags, upload(bags.entry_bags));
    if (entries > 0) {
      PST_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(bag_weights_, bags.weights.data(), sizeof(float) * entries,
                                     cudaMemcpyHostToDevice, stream_),
                     "cudaMemcpyAsync (embedding bag weights)"));
    }
    device.weights = bag_weights_;
    return device;
  }

  template <typename Launch>
  absl::Status QueueLoss(PendingLoss pending, Launch launch, absl::string_view what) {
    loss_slot_.Clear();
    PST_RETURN_IF_ERROR(UseDevice());
    PST_RETURN_IF_ERROR(CudaStatus(launch(), what));
    if (absl::Status s = CudaStatus(cudaMemcpyAsync(host_totals_, totals_, sizeof(cuda::LossTotals),
                                                    cudaMemcpyDeviceToHost, stream_),
                                    "cudaMemcpyAsync (loss totals)");
        !s.ok()) {
      return s;
    }
    pending_ = pending;
    loss_slot_.Queued();
    return absl::OkStatus();
  }

  const int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::LossPartial* partials_ = nullptr;  // device, kMaxLossBlocks entries
  float* column_scratch_ = nullptr;        // device, kColumnSumsScratch floats
  int* bag_ints_ = nullptr;                // device: the last bags' index arrays
  size_t bag_int_capacity_ = 0;
  float* bag_weights_ = nullptr;           // device: the last bags' weights
  size_t bag_weight_capacity_ = 0;
  cuda::LossTotals* totals_ = nullptr;     // device
  cuda::LossTotals* host_totals_ = nullptr;  // pinned host
  PendingLoss pending_;
  LossSlot loss_slot_;
};

}  // namespace

std::string NoGpuReason() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(error), ": ",
                        cudaGetErrorString(error),
                        error == cudaErrorInsufficientDriver
                            ? " (no NVIDIA driver, or one older than this CUDA runtime)"
                            : "");
  }
  return count == 0 ? "cudaGetDeviceCount: 0 devices" : "";
}

bool CudaCompiledIn() { return true; }

int VisibleGpuCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Kernels>> MakeCudaKernels(int device) {
  const int visible = VisibleGpuCount();
  if (visible == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu:", device, " requested but no GPU is visible (", NoGpuReason(), ")"));
  }
  if (device < 0 || device >= visible) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu:", device, " requested but only ", visible, " GPU(s) are visible (gpu:0..gpu:",
        visible - 1, "); check CUDA_VISIBLE_DEVICES"));
  }
  auto kernels = std::make_unique<CudaKernels>(device);
  if (absl::Status s = kernels->Init(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("gpu:", device, ": ", s.message()));
  }
  return kernels;
}

}  // namespace pst
