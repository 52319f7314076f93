// The state behind Kernels::TakeLoss (kernels.h), shared by the backends: a
// loss result is taken once, and only after a wait that followed its loss
// call.
#ifndef PST_KERNELS_LOSS_SLOT_H_
#define PST_KERNELS_LOSS_SLOT_H_

#include "absl/status/status.h"

namespace pst {

class LossSlot {
 public:
  // A loss call queued its computation (replacing any result not taken).
  void Queued() { state_ = State::kQueued; }
  // A loss call was refused: nothing is pending.
  void Clear() { state_ = State::kEmpty; }
  // A wait for all queued work returned OK.
  void Waited() {
    if (state_ == State::kQueued) state_ = State::kReady;
  }
  // OK, and the result counts as taken, when it may be read now.
  absl::Status Take() {
    switch (state_) {
      case State::kEmpty:
        return absl::FailedPreconditionError("TakeLoss: no loss call is pending");
      case State::kQueued:
        return absl::FailedPreconditionError(
            "TakeLoss: the loss is queued but not waited for; call Synchronize() first");
      case State::kReady:
        break;
    }
    state_ = State::kEmpty;
    return absl::OkStatus();
  }

 private:
  enum class State { kEmpty, kQueued, kReady };
  State state_ = State::kEmpty;
};

}  // namespace pst

#endif  // PST_KERNELS_LOSS_SLOT_H_
