// The SYNC step's reduction: the mean of the workers' gradients, summed in
// rank order, staged into the store through the optimizer in one pass.
//
// Each element's mean is 0 + g_0 + g_1 + ... (ranks in order) times 1/N,
// then the optimizer's rule; nothing depends on how the elements are split,
// so a large variable is split over several threads (the workers are idle,
// waiting for this step) and the result is bitwise the same as one thread's.
#ifndef PST_PS_SERVER_CORE_SYNC_REDUCE_H_
#define PST_PS_SERVER_CORE_SYNC_REDUCE_H_

#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/thread_pool.h"
#include "ps_server/core/variable_store.h"

namespace pst {

// Stages into `store`'s variable `index` the update by the mean of
// `gradients` (one per contributing worker, in rank order, each the
// variable's size) times `scale` (1/N), as VariableStore::Stage does; a
// variable of at least kParallelElements elements is split over up to
// `parts` threads from `threads`, with `settings` (its gradient scale
// applies to the mean). InvalidArgument as Stage's when the result is not
// finite (nothing is staged then).
inline constexpr size_t kParallelElements = size_t{1} << 16;
absl::Status StageMean(VariableStore* store, int index,
                       const std::vector<std::span<const float>>& gradients, float scale,
                       const UpdateSettings& settings, ThreadPool* threads, int parts);

// Runs `stage` over elements [0, n) of `target`'s variable: below
// kParallelElements in one share, else in up to `parts` shares of whole
// `block`s, each but the first on `threads` with a copy of `target`, whose
// findings (StageTarget::Merge) `target` then takes in. Returns once every
// share is staged.
void StageInParts(VariableStore::StageTarget* target, size_t n, size_t block, ThreadPool* threads,
                  int parts,
                  absl::FunctionRef<void(VariableStore::StageTarget*, size_t, size_t)> stage);

// The squared 2-norm of the mean StageMean stages: the same sums of the
// first `size` elements of `gradients`, times `scale`.
double SquaredNormOfScaledSum(const std::vector<std::span<const float>>& gradients, float scale,
                              size_t size);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SYNC_REDUCE_H_
