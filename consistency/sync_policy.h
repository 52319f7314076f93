// SYNC: the version advances once per step. A push computed at the current
// version is aggregated until `replicas_to_aggregate` distinct live workers
// have pushed (all live workers by default); one computed at an older
// version is dropped, which is what makes the extra workers backups. A
// worker that pushed for the step and then finished still counts: the step
// waits for the others as it would have without the Done.
#ifndef PST_CONSISTENCY_SYNC_POLICY_H_
#define PST_CONSISTENCY_SYNC_POLICY_H_

#include "consistency/consistency_policy.h"

namespace pst {

class SyncPolicy final : public ConsistencyPolicy {
 public:
  // replicas_to_aggregate: gradients per step; 0 = every live worker.
  explicit SyncPolicy(int replicas_to_aggregate) : replicas_(replicas_to_aggregate) {}

  bool PushCarriesEveryVariable() const override { return true; }
  // FailedPrecondition for a second push of one worker in one step.
  absl::StatusOr<Admission> AdmitPush(const ShardView& shard, int worker,
                                      int64_t computed_at) const override;
  bool StepComplete(const ShardView& shard) const override;
  bool CompletesStepAlone(const ShardView& shard, int worker) const override;
  bool PullMayProceed(const ShardView& shard, int worker, int64_t min_version) const override;
  // Never: the answer is the step's result, which the other workers decide.
  bool AnswerMayStreamDuringPush(int64_t, int64_t) const override { return false; }
  // The step the push belongs to must be in the values.
  int64_t MinVersionAfterPush(int64_t computed_at) const override { return computed_at + 1; }

 private:
  // The gradients the current step waits for (at least 1), with worker
  // `pushing` (if any) counted as having pushed.
  int RequiredGradients(const ShardView& shard, int pushing = -1) const;

  const int replicas_;
};

}  // namespace pst

#endif  // PST_CONSISTENCY_SYNC_POLICY_H_
