// An ASYNC push the shard applies while its gradient streams in: the
// transports' side of ParameterShard::BeginStreamedPush and
// CommitStreamedPush (an exchange over TCP, or out of a shared region).
#ifndef PST_PS_SERVER_CORE_STREAMED_UPDATE_H_
#define PST_PS_SERVER_CORE_STREAMED_UPDATE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "ps_server/core/variable_store.h"

namespace pst {

class ParameterShard;

// An ASYNC push applied while its gradient streams in, a piece at a time,
// and committed when the stream ends: the transfer and the update overlap,
// and no copy of the whole gradient is made. The update is staged in the
// shard's staging buffers, so while one exists every other update of the
// shard waits (pulls do not: they read the published values). A stream
// holds one only as long as its data keeps coming; a client that goes away
// ends its call, and the update is dropped with the call.
class StreamedUpdate {
 public:
  ~StreamedUpdate();  // drops the update unless committed
  StreamedUpdate(const StreamedUpdate&) = delete;
  StreamedUpdate& operator=(const StreamedUpdate&) = delete;

  // Applies the gradient of elements [first, first + gradient.size()) of
  // the header's gradient number `tensor`, in stream order (PieceSequence):
  // each element once. A gradient value that is not finite gives a result
  // that is not (every rule scales the gradient into its output or state),
  // which finite() reports and the commit refuses; callers check the
  // gradient first where they can name the culprit for the same cost.
  void Apply(int tensor, int64_t first, std::span<const float> gradient) {
    targets_[tensor].Apply(first, gradient);
  }
  // Whether everything staged for gradient number `tensor` is finite.
  bool finite(int tensor) const { return targets_[tensor].finite(); }

  // Applies gradient number `tensor` whole, elements [0, elements), for a
  // caller that has all of it at hand (a push in a shared region):
  // stage(target, first, count) must apply elements [first, first + count)
  // to `target` (StageTarget::Apply), for consecutive blocks of at most
  // `block` elements. A large gradient is split into parts of whole blocks,
  // staged at once on the shard's threads (as a SYNC step's sum is), each
  // on its own copy of the target, merged after; `stage` must be safe to
  // call from several threads. Returns the first failure of `stage`.
  using StagePart = absl::FunctionRef<absl::Status(VariableStore::StageTarget* target,
                                                   int64_t first, int64_t count)>;
  absl::Status ApplyWhole(int tensor, int64_t elements, int64_t block, StagePart stage);

  // The buffer the header's variable `tensor` is staged into: once
  // elements have been applied, their new values are there, unchanged
  // until the update is committed (and, committed, they are the variable's
  // values). For an exchange whose answer sends each block back as it is
  // staged.
  const Values& staged_values(int tensor) const { return staged_[tensor]; }

  // How the shard ends the stream if it stalls while another update waits
  // (ShardOptions::stalled_stream_timeout): e.g. cancel the call, so that
  // the stream's next read fails and the update is dropped. Thread-safe;
  // set before the first piece. Called at most once.
  void SetCancel(std::function<void()> cancel);
  // The stream delivered data just now.
  void Progressed() { last_progress_ = SteadyNanos(); }

 private:
  friend class ParameterShard;
  friend class StreamedStaging;
  // `threads` and `parts` split a whole gradient's staging (ApplyWhole).
  StreamedUpdate(ParameterShard* shard, ThreadPool* threads, int parts)
      : shard_(shard), threads_(threads), parts_(parts) {}
  // A monotonic clock: a wall-clock step must not cancel a healthy stream.
  static int64_t SteadyNanos() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  absl::Duration Idle() const { return absl::Nanoseconds(SteadyNanos() - last_progress_.load()); }
  // Readies the staging of the variables indices_ names in `store`, with
  // `settings`; on a failure the update holds no staging.
  absl::Status Stage(VariableStore& store, const UpdateSettings& settings);
  // Checks and keeps what was staged of each variable (FinishStage).
  absl::Status Finish(VariableStore& store);

  ParameterShard* const shard_;
  ThreadPool* const threads_;
  const int parts_;
  std::atomic<int64_t> last_progress_{SteadyNanos()};
  std::function<void()> cancel_;  // guarded by the shard's mu_
  bool cancelled_ = false;        // guarded by the shard's mu_
  int worker_ = 0;
  int64_t computed_at_ = 0;
  int64_t staleness_ = 0;
  bool whole_step_ = false;  // a SYNC step of this one push
  std::vector<int> indices_;  // the variables, in header order
  std::vector<VariableStore::StageTarget> targets_;
  // Dropped before the staging is freed, so that the next update does not
  // see them as a pull still holding the buffers.
  std::vector<Values> staged_;
  bool holds_staging_ = true;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_STREAMED_UPDATE_H_
