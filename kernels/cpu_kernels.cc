// The CPU backend. Matrix products go to OpenBLAS (CBLAS, column-major,
// through the same operand mapping as the cuBLAS backend); the elementwise
// kernels are loops the compiler vectorizes. OpenBLAS runs on the calling
// thread only: a worker's compute threads are its towers, one per core it
// was given, and several workers may share a machine.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include <cblas.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/column_major_gemm.h"
#include "kernels/kernels.h"
#include "kernels/loss_slot.h"

namespace pst {
namespace {

// OpenBLAS's own thread pool would compete with the towers for the cores.
void UseOneBlasThreadPerCaller() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

CBLAS_TRANSPOSE BlasTranspose(bool transpose) { return transpose ? CblasTrans : CblasNoTrans; }

absl::Status CheckDims(const char* op, std::initializer_list<int> dims) {
  for (int d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative dimension ", d));
  }
  return absl::OkStatus();
}

absl::Status CheckStrides(bool transpose_a, bool transpose_b, int m, int n, int k, int lda,
                          int ldb, int ldc) {
  if (StridesCoverWidths(transpose_a, transpose_b, m, n, k, lda, ldb, ldc)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("Gemm: a row stride narrower than its matrix (lda ",
                                                 lda, ", ldb ", ldb, ", ldc ", ldc, ")"));
}

class CpuKernels final : public Kernels {
 public:
  CpuKernels() { UseOneBlasThreadPerCaller(); }
  std::string Name() const override { return "cpu"; }
  bool ComputesOnHostMemory() const override { return true; }

  absl::StatusOr<float*> Allocate(size_t count) override {
    float* p = new (std::nothrow) float[std::max<size_t>(count, 1)]();
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", count, " floats"));
    }
    return p;
  }
  void Free(float* buffer) override { delete[] buffer; }

  absl::Status CopyToDevice(const float* host, float* device, size_t count) override {
    if (host != device) std::memcpy(device, host, count * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const float* device, float* host, size_t count) override {
    if (host != device) std::memcpy(host, device, count * sizeof(float));
    loss_slot_.Waited();
    return absl::OkStatus();
  }
  absl::StatusOr<float*> AllocateHost(size_t count) override { return Allocate(count); }
  void FreeHost(float* buffer) override { Free(buffer); }
  absl::Status CopyToHostAsync(const float* device, float* host, size_t count) override {
    if (host != device) std::memcpy(host, device, count * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    loss_slot_.Waited();
    return absl::OkStatus();
  }
  // Work is done when its call returns: there is never anything to wait for.
  absl::StatusOr<std::unique_ptr<QueueMarker>> NewMarker() override {
    class DoneMarker final : public QueueMarker {
     public:
      absl::Status Record() override { return absl::OkStatus(); }
      absl::Status Wait() override { return absl::OkStatus(); }
    };
    return std::make_unique<DoneMarker>();
  }

  absl::Status GemmStrided(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc) override {
    PST_RETURN_IF_ERROR(CheckDims("Gemm", {m, n, k}));
    PST_RETURN_IF_ERROR(CheckStrides(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
    if (m == 0 || n == 0) return absl::OkStatus();
    if (k == 0) {  // an empty sum: BLAS implementations disagree on it
      for (int row = 0; row < m; ++row) ScaleOutput(n, beta, c + static_cast<size_t>(row) * ldc);
      return absl::OkStatus();
    }
    const ColumnMajorGemm call =
        ToColumnMajorGemm(transpose_a, transpose_b, m, n, k, lda, ldb, ldc);
    cblas_sgemm(CblasColMajor, BlasTranspose(call.transpose_first),
                BlasTranspose(call.transpose_second), call.m, call.n, call.k, alpha, b,
                call.ld_first, a, call.ld_second, beta, c, call.ld_c);
    return absl::OkStatus();
  }

  absl::Status AddBias(int rows, int cols, const float* bias, float* y) override {
    for (int r = 0; r < rows; ++r) {
      float* __restrict row = y + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
    return absl::OkStatus();
  }

  absl::Status ActivationForward(ActivationKind kind, size_t count, float* y) override {
    if (kind == ActivationKind::kRelu) {
      for (size_t i = 0; i < count; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    } else {
      for (size_t i = 0; i < count; ++i) y[i] = std::tanh(y[i]);
    }
    return absl::OkStatus();
  }

  absl::Status ActivationBackward(ActivationKind kind, size_t count, const float* y,
                                  float* dy) override {
    if (kind == ActivationKind::kRelu) {
      for (size_t i = 0; i < count; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    } else {
      for (size_t i = 0; i < count; ++i) dy[i] *= 1.0f - y[i] * y[i];
    }
    return absl::OkStatus();
  }

  absl::Status ColumnSums(int rows, int cols, const float* m, float* out) override {
    std::fill(out, out + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float* __restrict row = m + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) out[c] += row[c];
    }
    return absl::OkStatus();
  }

  // The loss is computed at once and kept for TakeLoss, which still requires
  // a Synchronize() in between, so that code run on the CPU keeps to the
  // contract the CUDA backend needs.
  absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                   const float* labels, float* dlogits) override {
    if (rows <= 0 || classes <= 0) {
      loss_slot_.Clear();
      return absl::InvalidArgumentError("SoftmaxCrossEntropy needs rows and classes > 0");
    }
    loss_ = ComputeSoftmaxCrossEntropy(rows, classes, logits, labels, dlogits);
    loss_slot_.Queued();
    return absl::OkStatus();
  }

  absl::Status MeanSquaredError(int rows, int cols, const float* pred, const float* target,
                                float* dpred) override {
    if (rows <= 0 || cols <= 0) {
      loss_slot_.Clear();
      return absl::InvalidArgumentError("MeanSquaredError needs rows and cols > 0");
    }
    loss_ = ComputeMeanSquaredError(rows, cols, pred, target, dpred);
    loss_slot_.Queued();
    return absl::OkStatus();
  }

  absl::Status SigmoidCrossEntropy(int rows, const float* logits, const float* labels,
                                   float* dlogits) override {
    if (rows <= 0) {
      loss_slot_.Clear();
      return absl::InvalidArgumentError("SigmoidCrossEntropy needs rows > 0");
    }
    loss_ = ComputeSigmoidCrossEntropy(rows, logits, labels, dlogits);
    loss_slot_.Queued();
    return absl::OkStatus();
  }

  absl::StatusOr<LossResult> TakeLoss() override {
    PST_RETURN_IF_ERROR(loss_slot_.Take());
    return loss_;
  }

  absl::Status EmbeddingBagsForward(const EmbeddingBags& bags, int dim, const float* rows,
                                    float* out) override {
    PST_RETURN_IF_ERROR(bags.CheckFinished(dim));
    PoolBagsOnHost(bags, dim, rows, out);
    return absl::OkStatus();
  }

  absl::Status EmbeddingBagsBackward(const EmbeddingBags& bags, int dim, const float* out_grad,
                                     float* row_grads) override {
    PST_RETURN_IF_ERROR(bags.CheckFinished(dim));
    PoolBagsBackwardOnHost(bags, dim, out_grad, row_grads);
    return absl::OkStatus();
  }

 private:
  static absl::StatusOr<LossResult> ComputeSoftmaxCrossEntropy(int rows, int classes,
                                                               const float* logits,
                                                               const float* labels,
                                                               float* dlogits) {
    LossResult result;
    const float inv_rows = 1.0f / static_cast<float>(rows);
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<size_t>(r) * classes;
      const int label = static_cast<int>(labels[r]);
      if (label < 0 || label >= classes || static_cast<float>(label) != labels[r]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "label ", labels[r], " of row ", r, " is not a class index in [0, ", classes, ")"));
      }
      int argmax = 0;
      for (int c = 1; c < classes; ++c) {
        if (z[c] > z[argmax]) argmax = c;
      }
      const float max = z[argmax];
      double sum = 0.0;
      for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - max));
      result.loss += std::log(sum) - static_cast<double>(z[label] - max);
      result.correct += argmax == label ? 1 : 0;
      if (dlogits != nullptr) {
        float* d = dlogits + static_cast<size_t>(r) * classes;
        const double inv_sum = 1.0 / sum;
        for (int c = 0; c < classes; ++c) {
          float p = static_cast<float>(std::exp(static_cast<double>(z[c] - max)) * inv_sum);
          d[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_rows;
        }
      }
    }
    result.loss /= rows;
    return result;
  }

  // Per row, in double: log(1 + e^z) - y z = max(z, 0) - y z + log1p(e^-|z|),
  // which neither overflows nor loses the small terms.
  static LossResult ComputeSigmoidCrossEntropy(int rows, const float* logits, const float* labels,
                                               float* dlogits) {
    LossResult result;
    const float inv_rows = 1.0f / static_cast<float>(rows);
    for (int r = 0; r < rows; ++r) {
      const double z = logits[r];
      const double y = labels[r];
      result.loss += std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::abs(z)));
      result.correct += (z > 0.0) == (y > 0.5) ? 1 : 0;
      if (dlogits != nullptr) {
        const float p = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
        dlogits[r] = (p - labels[r]) * inv_rows;
      }
    }
    result.loss /= rows;
    return result;
  }

  static absl::StatusOr<LossResult> ComputeMeanSquaredError(int rows, int cols, const float* pred,
                                                            const float* target, float* dpred) {
    const size_t count = static_cast<size_t>(rows) * cols;
    const float scale = 2.0f / static_cast<float>(count);
    double sum = 0.0;
    for (size_t i = 0; i < count; ++i) {
      const float diff = pred[i] - target[i];
      sum += static_cast<double>(diff) * diff;
      if (dpred != nullptr) dpred[i] = scale * diff;
    }
    LossResult result;
    result.loss = sum / static_cast<double>(count);
    return result;
  }

  static void ScaleOutput(size_t count, float beta, float* c) {
    if (beta == 0.0f) {
      std::fill(c, c + count, 0.0f);
    } else if (beta != 1.0f) {
      for (size_t i = 0; i < count; ++i) c[i] *= beta;
    }
  }

  LossSlot loss_slot_;
  absl::StatusOr<LossResult> loss_;
};

}  // namespace

std::unique_ptr<Kernels> MakeCpuKernels() { return std::make_unique<CpuKernels>(); }

}  // namespace pst
