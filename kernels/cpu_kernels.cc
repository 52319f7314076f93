// The CPU reference backend. Single-threaded on purpose: a worker process
// owns one core, and several workers share a machine.
//
// Matrix products are written so that the innermost loop always runs over
// contiguous memory (the compiler vectorizes it), rows of C are processed
// four at a time so each loaded row of B feeds four rows, and the k and n
// dimensions are blocked so the working tile of B stays in cache. Products
// with a transposed B first transpose it into a reusable scratch buffer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/kernels.h"
#include "kernels/loss_slot.h"

namespace pst {
namespace {

constexpr int kBlockK = 128;  // rows of B per tile
constexpr int kBlockN = 512;  // columns of B and C per tile (2 KiB per row)

// c[i, j0:j1] += alpha * sum_p a(i, p) * b[p, j0:j1] for rows i0 <= i < i1,
// where a(i, p) = a[i * a_row + p * a_col] (either layout of A) and B is
// row-major k x n. Cloned for x86-64-v3 (AVX2 + FMA) with a baseline fallback.
// Not under ThreadSanitizer: the ifunc resolver that picks the clone runs
// while the dynamic loader relocates, before TSan's runtime is up, and TSan's
// instrumentation of that resolver crashes the process at load.
#if defined(__SANITIZE_THREAD__)
#define PST_GEMM_CLONES
#else
#define PST_GEMM_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
PST_GEMM_CLONES
void GemmTile(int i0, int i1, int p0, int p1, int j0, int j1, int n, float alpha,
              const float* a, int a_row, int a_col, const float* b, float* c) {
  const int width = j1 - j0;
  int i = i0;
  for (; i + 4 <= i1; i += 4) {
    float* __restrict c0 = c + static_cast<size_t>(i) * n + j0;
    float* __restrict c1 = c0 + n;
    float* __restrict c2 = c1 + n;
    float* __restrict c3 = c2 + n;
    for (int p = p0; p < p1; ++p) {
      const float* __restrict bp = b + static_cast<size_t>(p) * n + j0;
      const float a0 = alpha * a[static_cast<size_t>(i) * a_row + static_cast<size_t>(p) * a_col];
      const float a1 = alpha * a[static_cast<size_t>(i + 1) * a_row + static_cast<size_t>(p) * a_col];
      const float a2 = alpha * a[static_cast<size_t>(i + 2) * a_row + static_cast<size_t>(p) * a_col];
      const float a3 = alpha * a[static_cast<size_t>(i + 3) * a_row + static_cast<size_t>(p) * a_col];
      for (int j = 0; j < width; ++j) {
        const float bv = bp[j];
        c0[j] += a0 * bv;
        c1[j] += a1 * bv;
        c2[j] += a2 * bv;
        c3[j] += a3 * bv;
      }
    }
  }
  for (; i < i1; ++i) {
    float* __restrict ci = c + static_cast<size_t>(i) * n + j0;
    for (int p = p0; p < p1; ++p) {
      const float* __restrict bp = b + static_cast<size_t>(p) * n + j0;
      const float av = alpha * a[static_cast<size_t>(i) * a_row + static_cast<size_t>(p) * a_col];
      for (int j = 0; j < width; ++j) ci[j] += av * bp[j];
    }
  }
}

void Transpose(int rows, int cols, const float* in, float* out) {
  constexpr int kTile = 32;
  for (int r0 = 0; r0 < rows; r0 += kTile) {
    for (int c0 = 0; c0 < cols; c0 += kTile) {
      const int r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) out[static_cast<size_t>(c) * rows + r] = in[static_cast<size_t>(r) * cols + c];
      }
    }
  }
}

absl::Status CheckDims(const char* op, std::initializer_list<int> dims) {
  for (int d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative dimension ", d));
  }
  return absl::OkStatus();
}

class CpuKernels final : public Kernels {
 public:
  std::string Name() const override { return "cpu"; }

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

  absl::Status Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                    const float* a, const float* b, float beta, float* c) override {
    if (absl::Status s = CheckDims("Gemm", {m, n, k}); !s.ok()) return s;
    ScaleOutput(static_cast<size_t>(m) * n, beta, c);
    if (m == 0 || n == 0 || k == 0) return absl::OkStatus();
    if (transpose_b) {
      // op(b) = b^T with b stored n x k: lay it out k x n once.
      scratch_.resize(static_cast<size_t>(k) * n);
      Transpose(n, k, b, scratch_.data());
      b = scratch_.data();
    }
    // a(i, p) is a[i * k + p] for A m x k, or a[p * m + i] for A^T stored k x m.
    const int a_row = transpose_a ? 1 : k;
    const int a_col = transpose_a ? m : 1;
    for (int j0 = 0; j0 < n; j0 += kBlockN) {
      const int j1 = std::min(n, j0 + kBlockN);
      for (int p0 = 0; p0 < k; p0 += kBlockK) {
        const int p1 = std::min(k, p0 + kBlockK);
        GemmTile(0, m, p0, p1, j0, j1, n, alpha, a, a_row, a_col, b, c);
      }
    }
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

  absl::StatusOr<LossResult> TakeLoss() override {
    if (absl::Status s = loss_slot_.Take(); !s.ok()) return s;
    return loss_;
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

  std::vector<float> scratch_;  // transposed B, reused across calls
  LossSlot loss_slot_;
  absl::StatusOr<LossResult> loss_;
};

}  // namespace

std::unique_ptr<Kernels> MakeCpuKernels() { return std::make_unique<CpuKernels>(); }

}  // namespace pst
