// SSP (stale synchronous parallel): pushes are admitted as in ASYNC, and a
// worker's pull also waits until its clock is at most `staleness` pushes
// ahead of the slowest live worker that has not finished, so that fast
// workers cannot run away from slow ones.
#ifndef PST_CONSISTENCY_SSP_POLICY_H_
#define PST_CONSISTENCY_SSP_POLICY_H_

#include "consistency/async_policy.h"

namespace pst {

class SspPolicy final : public AsyncPolicy {
 public:
  SspPolicy(int staleness, bool staleness_lr_scaling, int max_staleness)
      : AsyncPolicy(staleness_lr_scaling, max_staleness), staleness_(staleness) {}

  bool PullMayProceed(const ShardView& shard, int worker, int64_t min_version) const override;
  // Never: the pull may have to wait for slower workers.
  bool AnswerMayStreamDuringPush(int64_t, int64_t) const override { return false; }

 private:
  const int staleness_;
};

}  // namespace pst

#endif  // PST_CONSISTENCY_SSP_POLICY_H_
