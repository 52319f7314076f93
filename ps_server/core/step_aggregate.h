// The gradients of the current SYNC step, summed in rank order as they
// arrive, outside the shard's lock.
//
// The step's mean is 0 + g_0 + g_1 + ... over the ranks that pushed, in
// rank order, times 1/N. A push lands while other pushes are still on
// their way: when every lower rank is already in the running sum, its
// gradient is decoded and added to the sum in one pass; otherwise it is
// decoded into its rank's slot and added as soon as the ranks before it
// are. So when the last push lands, at most its own gradient and the
// slots of ranks that lag behind remain to be added, and the step's
// completion reads the sum and those slots in one pass (StageMean). The
// additions happen in rank order whatever the arrival order, so the result
// is bitwise the same.
//
// Thread-safety: Land may run on several threads at once for different
// ranks. The caller admits one push per rank per step and calls Stage only
// once every admitted push has landed (no Land under way).
#ifndef PST_PS_SERVER_CORE_STEP_AGGREGATE_H_
#define PST_PS_SERVER_CORE_STEP_AGGREGATE_H_

#include <cstddef>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "ps.pb.h"
#include "ps_server/core/variable_store.h"

namespace pst {

class StepAggregate {
 public:
  explicit StepAggregate(int num_workers);

  // Sets the variables' sizes (elements) and empties the step. Memory
  // for the sum and the slots is taken when a step first needs it.
  void Reset(std::vector<size_t> sizes);

  // Adds `rank`'s push to the step: `push.gradients(i)` is the gradient of
  // variable `indices[i]`, every variable is present once, and every
  // payload has been checked (CheckTensorPayload).
  void Land(int rank, const PushRequest& push, std::span<const int> indices);

  // The ranks that landed in this step.
  int landed() const;

  // Stages into `store` the step's mean (the landed ranks' gradients summed
  // in rank order, times 1 / landed()) through the optimizer, as StageMean
  // does, and empties the step. InvalidArgument from the first variable
  // whose update is not finite; the store then holds a partial staging for
  // the caller to discard.
  absl::Status Stage(VariableStore* store, const UpdateSettings& settings, ThreadPool* threads,
                     int parts);
  // The squared 2-norm of the step's mean (as Stage would form it), the
  // step unchanged. Precondition: no Land under way.
  double SquaredNormOfMean();

 private:
  enum class Slot { kEmpty, kFilling, kWaiting, kSummed };

  // Decodes the push and adds it to the sum (or, for the step's first
  // rank, sets the sum to 0 + it).
  void AddToSum(const PushRequest& push, std::span<const int> indices);
  // Adds the waiting slots that continue the summed prefix of ranks, one
  // at a time, releasing the lock while adding.
  void SumWaitingPrefix() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ranks that landed, and variable v's parts to add in rank order:
  // the sum so far, then the ranks that waited.
  int LandedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PartsLocked(size_t v, std::vector<std::span<const float>>* parts) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_workers_;
  std::vector<size_t> sizes_;
  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  // The lowest rank not yet in the sum: the sum holds ranks [0, next_)
  // that landed, in order (a rank that does not push this step holds the
  // prefix at its place until Stage).
  int next_ ABSL_GUARDED_BY(mu_) = 0;
  // One thread adds to the sum at a time; it owns sum_, sum_started_ and
  // the slots it adds while this is set.
  bool summing_ ABSL_GUARDED_BY(mu_) = false;
  bool sum_started_ = false;
  std::vector<std::vector<float>> sum_;  // per variable
  // Per rank, per variable: a gradient that landed before its turn.
  std::vector<std::vector<std::vector<float>>> waiting_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_STEP_AGGREGATE_H_
