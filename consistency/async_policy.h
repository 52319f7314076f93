// ASYNC: every valid push is applied at once as the next version. Its
// staleness (the shard's version at arrival minus the version it was
// computed at) can scale its learning rate by 1 / (1 + staleness), and past
// `max_staleness` (0 = no bound) gets it dropped. A pull waits only for the
// version it asks for.
#ifndef PST_CONSISTENCY_ASYNC_POLICY_H_
#define PST_CONSISTENCY_ASYNC_POLICY_H_

#include "consistency/consistency_policy.h"

namespace pst {

class AsyncPolicy : public ConsistencyPolicy {
 public:
  AsyncPolicy(bool staleness_lr_scaling, int max_staleness)
      : lr_scaling_(staleness_lr_scaling), max_staleness_(max_staleness) {}

  bool PushCarriesEveryVariable() const override { return false; }
  absl::StatusOr<Admission> AdmitPush(const ShardView& shard, int worker,
                                      int64_t computed_at) const override;
  // Nothing is ever aggregated.
  bool StepComplete(const ShardView&) const override { return false; }
  bool CompletesStepAlone(const ShardView&, int) const override { return false; }
  bool PullMayProceed(const ShardView& shard, int worker, int64_t min_version) const override;
  // Committed, the push is the version after the one it was computed at, or
  // later: a pull that asks for no more needs no wait.
  bool AnswerMayStreamDuringPush(int64_t min_version, int64_t computed_at) const override {
    return min_version <= computed_at + 1;
  }
  // Whatever is newest once the push is in.
  int64_t MinVersionAfterPush(int64_t computed_at) const override { return computed_at; }

 private:
  const bool lr_scaling_;
  const int max_staleness_;
};

}  // namespace pst

#endif  // PST_CONSISTENCY_ASYNC_POLICY_H_
