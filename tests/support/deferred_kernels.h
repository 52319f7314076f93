// A Kernels decorator for tests that runs nothing until it must: every
// call is queued and runs, in call order, on the wrapped backend only when
// the caller waits (Synchronize, CopyToHost, a QueueMarker's Wait, or a
// Free/FreeHost, which wait as cudaFree does). It plays a GPU stream at its
// most delayed, on the CPU, so that code which reads a result before its wait,
// or rewrites a pinned buffer a queued copy has still to read, gets a wrong
// answer here as it would on a GPU, instead of passing by luck.
//
// A CopyToDevice from AllocateHost memory reads the host buffer when it runs,
// not when it is queued (as a DMA from pinned memory does); one from any
// other memory copies the data at the call (as the CUDA runtime stages
// pageable memory), so the caller may reuse it at once.
//
// Argument errors of queued calls come back from the wait that runs them.
#ifndef PST_TESTS_SUPPORT_DEFERRED_KERNELS_H_
#define PST_TESTS_SUPPORT_DEFERRED_KERNELS_H_

#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "kernels/kernels.h"

namespace pst {

class DeferredKernels final : public Kernels {
 public:
  // Wraps `inner` (the CPU reference unless told otherwise).
  explicit DeferredKernels(std::unique_ptr<Kernels> inner = MakeCpuKernels());
  ~DeferredKernels() override;

  // How many times a caller waited (Synchronize, CopyToHost, a marker's
  // Wait), whether or not work was queued.
  int64_t waits() const { return waits_; }
  // Calls queued and not yet run.
  size_t queued() const { return queue_.size(); }

  std::string Name() const override;
  absl::StatusOr<float*> Allocate(size_t count) override;
  void Free(float* buffer) override;
  absl::Status CopyToDevice(const float* host, float* device, size_t count) override;
  absl::Status CopyToHost(const float* device, float* host, size_t count) override;
  absl::StatusOr<float*> AllocateHost(size_t count) override;
  void FreeHost(float* buffer) override;
  absl::Status CopyToHostAsync(const float* device, float* host, size_t count) override;
  absl::Status Synchronize() override;
  absl::StatusOr<std::unique_ptr<QueueMarker>> NewMarker() override;
  absl::Status GemmStrided(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc) override;
  absl::Status AddBias(int rows, int cols, const float* bias, float* y) override;
  absl::Status ActivationForward(ActivationKind kind, size_t count, float* y) override;
  absl::Status ActivationBackward(ActivationKind kind, size_t count, const float* y,
                                  float* dy) override;
  absl::Status ColumnSums(int rows, int cols, const float* m, float* out) override;
  absl::Status SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                   const float* labels, float* dlogits) override;
  absl::Status MeanSquaredError(int rows, int cols, const float* pred, const float* target,
                                float* dpred) override;
  absl::Status SigmoidCrossEntropy(int rows, const float* logits, const float* labels,
                                   float* dlogits) override;
  absl::StatusOr<LossResult> TakeLoss() override;
  absl::Status EmbeddingBagsForward(const EmbeddingBags& bags, int dim, const float* rows,
                                    float* out) override;
  absl::Status EmbeddingBagsBackward(const EmbeddingBags& bags, int dim, const float* out_grad,
                                     float* row_grads) override;

 private:
  class Marker;

  void Enqueue(std::function<absl::Status()> call);
  // Runs the queued calls numbered below `end` (counted from the first call
  // ever queued); the first error, after running them all.
  absl::Status RunUntil(int64_t end);
  absl::Status RunAll() { return RunUntil(queued_total_); }
  bool IsPinned(const float* host) const;

  std::unique_ptr<Kernels> inner_;
  std::deque<std::function<absl::Status()>> queue_;  // not yet run, oldest first
  int64_t queued_total_ = 0;  // calls ever queued
  int64_t run_total_ = 0;     // calls ever run
  int64_t waits_ = 0;
  int64_t loss_queued_at_ = -1;      // queue number of the latest loss call
  std::map<const float*, size_t> pinned_;  // AllocateHost buffers: start -> floats
};

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_DEFERRED_KERNELS_H_
