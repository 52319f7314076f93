// The compute backend a worker trains with. One interface, two
// implementations: the CPU one (OpenBLAS + vectorized loops, always built) and
// the CUDA one (cuBLAS + small kernels, built when nvcc is present). Both
// map the row-major products onto column-major BLAS the same way
// (kernels/column_major_gemm.h).
//
// Contract shared by every method:
//  - Matrices are dense, row-major float32.
//  - Every float pointer passed to a method (other than the host side of the
//    Copy* methods) must come from this backend's Allocate(): host memory for
//    the CPU backend, device memory for the CUDA backend.
//  - Work may be queued asynchronously (the CUDA backend queues everything
//    on one stream, in call order); results read by the host are only valid
//    after CopyToHost (which orders after all earlier work) returns, or after
//    Synchronize() for CopyToHostAsync and for the loss (TakeLoss).
//  - Host buffers from AllocateHost (pinned memory on CUDA) may be read by
//    a queued CopyToDevice after the call returns: do not overwrite them
//    until a later CopyToHost or Synchronize() has returned, or a
//    QueueMarker recorded after the copy has been waited for. Host memory
//    from anywhere else may be reused as soon as CopyToDevice returns.
//  - Errors come back as absl::Status naming the failing call, never as a
//    silently wrong answer.
#ifndef PST_KERNELS_KERNELS_H_
#define PST_KERNELS_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/column_major_gemm.h"
#include "kernels/embedding_bags.h"

namespace pst {

enum class ActivationKind { kRelu, kTanh };

// A point in a backend's queue (a CUDA event on the CUDA backend). Record()
// marks the end of the work queued so far; Wait() returns once that work has
// finished, without waiting for anything queued after the Record() (and at
// once if the marker was never recorded). Must not outlive its Kernels.
class QueueMarker {
 public:
  virtual ~QueueMarker() = default;
  virtual absl::Status Record() = 0;
  virtual absl::Status Wait() = 0;
};

// Mean loss over the rows of a batch, and (for classification) how many rows
// were predicted correctly.
struct LossResult {
  double loss = 0.0;
  int64_t correct = 0;
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // "cpu" or "cuda:N".
  virtual std::string Name() const = 0;

  // True when this backend's memory is host memory (the CPU backend): a
  // caller may then compute on host buffers directly instead of copying
  // them in and out.
  virtual bool ComputesOnHostMemory() const { return false; }

  virtual absl::StatusOr<float*> Allocate(size_t count) = 0;
  virtual void Free(float* buffer) = 0;
  virtual absl::Status CopyToDevice(const float* host, float* device, size_t count) = 0;
  virtual absl::Status CopyToHost(const float* device, float* host, size_t count) = 0;

  // Host staging memory for parameters and gradients: page-locked on CUDA
  // (so copies are true DMA and overlap), plain memory on the CPU.
  virtual absl::StatusOr<float*> AllocateHost(size_t count) = 0;
  virtual void FreeHost(float* buffer) = 0;
  // Queues a copy into `host` (from AllocateHost); the data is there once
  // Synchronize() returns. Many of these plus one Synchronize() cost one wait.
  virtual absl::Status CopyToHostAsync(const float* device, float* host, size_t count) = 0;
  // Waits for all queued work; returns the first asynchronous error.
  virtual absl::Status Synchronize() = 0;

  // A marker of this backend's queue, not yet recorded (see QueueMarker).
  virtual absl::StatusOr<std::unique_ptr<QueueMarker>> NewMarker() = 0;

  // c[m,n] = alpha * op(a) * op(b) + beta * c, where op(x) is x or its
  // transpose. op(a) is m x k, op(b) is k x n, all dense and row-major.
  // With beta == 0, c is not read.
  absl::Status Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                    const float* a, const float* b, float beta, float* c) {
    return GemmStrided(transpose_a, transpose_b, m, n, k, alpha, a,
                       DenseLeadingDimension(transpose_a, m, k), b,
                       DenseLeadingDimension(transpose_b, k, n), beta, c, n);
  }
  // Gemm on blocks of wider row-major matrices: the rows of a, b and c (as
  // stored) start lda, ldb and ldc floats apart, each at least its width.
  // InvalidArgument for a stride narrower than its matrix.
  virtual absl::Status GemmStrided(bool transpose_a, bool transpose_b, int m, int n, int k,
                                   float alpha, const float* a, int lda, const float* b, int ldb,
                                   float beta, float* c, int ldc) = 0;

  // y[r, c] += bias[c] for every row r.
  virtual absl::Status AddBias(int rows, int cols, const float* bias, float* y) = 0;

  // y = f(y), elementwise, in place.
  virtual absl::Status ActivationForward(ActivationKind kind, size_t count, float* y) = 0;

  // dy *= f'(x) where y = f(x) is the forward output (both ReLU and tanh have
  // derivatives expressible from their output).
  virtual absl::Status ActivationBackward(ActivationKind kind, size_t count, const float* y,
                                          float* dy) = 0;

  // out[c] = sum over rows of m[r, c] (the bias gradient).
  virtual absl::Status ColumnSums(int rows, int cols, const float* m, float* out) = 0;

  // The loss calls queue the loss computation (and the copy of its totals
  // to the host) like any other work, so the host need not wait between the
  // forward and the backward pass; TakeLoss() reads the result at the end of
  // the step. The returned status covers the arguments only (InvalidArgument
  // for empty shapes); a label that is not a class index is found as the loss
  // is computed, and TakeLoss reports it. A loss call replaces a result not
  // yet taken.

  // Softmax cross-entropy averaged over rows. labels[r] holds the class index
  // of row r as a float. Writes dlogits = (softmax(logits) - onehot) / rows
  // (dlogits may be null for evaluation); the loss is the mean over rows, and
  // correct the number of rows whose argmax equals the label.
  virtual absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                           const float* labels, float* dlogits) = 0;

  // Mean squared error: loss = sum((pred - target)^2) / (rows * cols).
  // Writes dpred = 2 (pred - target) / (rows * cols) (dpred may be null);
  // correct is 0.
  virtual absl::Status MeanSquaredError(int rows, int cols, const float* pred,
                                        const float* target, float* dpred) = 0;

  // Sigmoid cross-entropy (log-loss) of one logit z per row against a label
  // y in [0, 1]: loss = mean over rows of log(1 + e^z) - y z. Writes
  // dlogits = (sigmoid(z) - y) / rows (dlogits may be null); correct counts
  // the rows where z > 0 exactly when y > 0.5.
  virtual absl::Status SigmoidCrossEntropy(int rows, const float* logits, const float* labels,
                                           float* dlogits) = 0;

  // The result of the latest loss call, once a Synchronize() (or a
  // CopyToHost, which waits for all earlier work) called after it has
  // returned OK; each result is taken once. InvalidArgument naming the row
  // for a bad label; FailedPrecondition when no loss call is pending, or
  // when it has not been waited for (TakeLoss never waits itself: the wait
  // is the caller's, once per step).
  virtual absl::StatusOr<LossResult> TakeLoss() = 0;

  // Pooled embedding lookups and their backward pass, as
  // kernels/embedding_bags.h defines them. `rows` ([bags.num_rows, dim]),
  // `out`, `out_grad` and `row_grads` are this backend's memory; `bags` is
  // host memory, finished (EmbeddingBags::Finish) for this dim, and must not
  // change until the work has been waited for. The backward overwrites all
  // of row_grads ([bags.num_rows, dim]).
  virtual absl::Status EmbeddingBagsForward(const EmbeddingBags& bags, int dim, const float* rows,
                                            float* out) = 0;
  virtual absl::Status EmbeddingBagsBackward(const EmbeddingBags& bags, int dim,
                                             const float* out_grad, float* row_grads) = 0;
};

// The CPU backend: matrix products on OpenBLAS, which runs on the calling
// thread only (one compute thread per tower).
std::unique_ptr<Kernels> MakeCpuKernels();

}  // namespace pst

#endif  // PST_KERNELS_KERNELS_H_
