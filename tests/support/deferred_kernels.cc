#include "tests/support/deferred_kernels.h"

#include <iterator>
#include <vector>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pst {

// Record() remembers how many calls were queued; Wait() runs those.
class DeferredKernels::Marker final : public QueueMarker {
 public:
  explicit Marker(DeferredKernels* kernels) : kernels_(kernels) {}
  absl::Status Record() override {
    end_ = kernels_->queued_total_;
    return absl::OkStatus();
  }
  absl::Status Wait() override {
    ++kernels_->waits_;
    return kernels_->RunUntil(end_);
  }

 private:
  DeferredKernels* kernels_;
  int64_t end_ = 0;  // never recorded: nothing to wait for
};

DeferredKernels::DeferredKernels(std::unique_ptr<Kernels> inner) : inner_(std::move(inner)) {}

// Calls still queued are dropped: what they point to may be gone already.
DeferredKernels::~DeferredKernels() = default;

std::string DeferredKernels::Name() const { return absl::StrCat("deferred ", inner_->Name()); }

void DeferredKernels::Enqueue(std::function<absl::Status()> call) {
  queue_.push_back(std::move(call));
  ++queued_total_;
}

absl::Status DeferredKernels::RunUntil(int64_t end) {
  absl::Status first_error;
  while (run_total_ < end && !queue_.empty()) {
    std::function<absl::Status()> call = std::move(queue_.front());
    queue_.pop_front();
    ++run_total_;
    if (absl::Status s = call(); !s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

bool DeferredKernels::IsPinned(const float* host) const {
  auto after = pinned_.upper_bound(host);
  if (after == pinned_.begin()) return false;
  const auto& [start, count] = *std::prev(after);
  return host < start + count;
}

absl::StatusOr<float*> DeferredKernels::Allocate(size_t count) { return inner_->Allocate(count); }

void DeferredKernels::Free(float* buffer) {
  RunAll().IgnoreError();  // as cudaFree, wait for work that may use it
  inner_->Free(buffer);
}

absl::StatusOr<float*> DeferredKernels::AllocateHost(size_t count) {
  absl::StatusOr<float*> buffer = inner_->AllocateHost(count);
  if (buffer.ok()) pinned_[*buffer] = count;
  return buffer;
}

void DeferredKernels::FreeHost(float* buffer) {
  RunAll().IgnoreError();  // no queued copy may still use it
  pinned_.erase(buffer);
  inner_->FreeHost(buffer);
}

absl::Status DeferredKernels::CopyToDevice(const float* host, float* device, size_t count) {
  if (IsPinned(host)) {
    Enqueue([this, host, device, count] { return inner_->CopyToDevice(host, device, count); });
    return absl::OkStatus();
  }
  auto staged = std::make_shared<std::vector<float>>(host, host + count);
  Enqueue([this, staged, device, count] {
    return inner_->CopyToDevice(staged->data(), device, count);
  });
  return absl::OkStatus();
}

absl::Status DeferredKernels::CopyToHost(const float* device, float* host, size_t count) {
  ++waits_;
  PST_RETURN_IF_ERROR(RunAll());
  return inner_->CopyToHost(device, host, count);
}

absl::Status DeferredKernels::CopyToHostAsync(const float* device, float* host, size_t count) {
  Enqueue([this, device, host, count] { return inner_->CopyToHostAsync(device, host, count); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::Synchronize() {
  ++waits_;
  PST_RETURN_IF_ERROR(RunAll());
  return inner_->Synchronize();
}

absl::StatusOr<std::unique_ptr<QueueMarker>> DeferredKernels::NewMarker() {
  return std::make_unique<Marker>(this);
}

absl::Status DeferredKernels::GemmStrided(bool transpose_a, bool transpose_b, int m, int n,
                                          int k, float alpha, const float* a, int lda,
                                          const float* b, int ldb, float beta, float* c, int ldc) {
  Enqueue([=, this] {
    return inner_->GemmStrided(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                               ldc);
  });
  return absl::OkStatus();
}

absl::Status DeferredKernels::AddBias(int rows, int cols, const float* bias, float* y) {
  Enqueue([=, this] { return inner_->AddBias(rows, cols, bias, y); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::ActivationForward(ActivationKind kind, size_t count, float* y) {
  Enqueue([=, this] { return inner_->ActivationForward(kind, count, y); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::ActivationBackward(ActivationKind kind, size_t count,
                                                 const float* y, float* dy) {
  Enqueue([=, this] { return inner_->ActivationBackward(kind, count, y, dy); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::ColumnSums(int rows, int cols, const float* m, float* out) {
  Enqueue([=, this] { return inner_->ColumnSums(rows, cols, m, out); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                                  const float* labels, float* dlogits) {
  loss_queued_at_ = queued_total_;
  Enqueue([=, this] {
    return inner_->SoftmaxCrossEntropy(rows, classes, logits, labels, dlogits);
  });
  return absl::OkStatus();
}

absl::Status DeferredKernels::MeanSquaredError(int rows, int cols, const float* pred,
                                               const float* target, float* dpred) {
  loss_queued_at_ = queued_total_;
  Enqueue([=, this] { return inner_->MeanSquaredError(rows, cols, pred, target, dpred); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::SigmoidCrossEntropy(int rows, const float* logits,
                                                  const float* labels, float* dlogits) {
  loss_queued_at_ = queued_total_;
  Enqueue([=, this] { return inner_->SigmoidCrossEntropy(rows, logits, labels, dlogits); });
  return absl::OkStatus();
}

// `bags` is read when the work runs: the contract lets a backend do that.
absl::Status DeferredKernels::EmbeddingBagsForward(const EmbeddingBags& bags, int dim,
                                                   const float* rows, float* out) {
  Enqueue([=, &bags, this] { return inner_->EmbeddingBagsForward(bags, dim, rows, out); });
  return absl::OkStatus();
}

absl::Status DeferredKernels::EmbeddingBagsBackward(const EmbeddingBags& bags, int dim,
                                                    const float* out_grad, float* row_grads) {
  Enqueue([=, &bags, this] {
    return inner_->EmbeddingBagsBackward(bags, dim, out_grad, row_grads);
  });
  return absl::OkStatus();
}

absl::StatusOr<LossResult> DeferredKernels::TakeLoss() {
  if (loss_queued_at_ >= run_total_) {
    return absl::FailedPreconditionError(
        "TakeLoss: the loss is queued but not waited for; call Synchronize() first");
  }
  return inner_->TakeLoss();
}

}  // namespace pst
