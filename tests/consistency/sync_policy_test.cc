#include "consistency/sync_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using Action = Admission::Action;

ShardView View(int64_t version, const std::vector<WorkerProgress>& workers) {
  return {.version = version, .workers = workers};
}

TEST(SyncPolicyTest, AggregatesCurrentPushesAndDropsStaleOnes) {
  SyncPolicy policy(0);
  std::vector<WorkerProgress> workers(2);
  EXPECT_EQ(policy.AdmitPush(View(3, workers), 0, 3)->action, Action::kAggregate);
  EXPECT_EQ(policy.AdmitPush(View(3, workers), 0, 2)->action, Action::kDrop);
  EXPECT_TRUE(policy.PushCarriesEveryVariable());
}

TEST(SyncPolicyTest, RefusesASecondPushInOneStep) {
  SyncPolicy policy(0);
  std::vector<WorkerProgress> workers(2);
  workers[1].pushed = true;
  absl::StatusOr<Admission> again = policy.AdmitPush(View(3, workers), 1, 3);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  // A stale push from the same worker is a backup's: dropped, not refused.
  EXPECT_EQ(policy.AdmitPush(View(3, workers), 1, 2)->action, Action::kDrop);
}

TEST(SyncPolicyTest, StepWaitsForEveryLiveWorker) {
  SyncPolicy policy(0);
  std::vector<WorkerProgress> workers(3);
  EXPECT_FALSE(policy.StepComplete(View(0, workers)));  // nothing aggregated
  workers[0].pushed = workers[1].pushed = true;
  EXPECT_FALSE(policy.StepComplete(View(0, workers)));
  workers[2].live = false;  // the silent worker is not waited for
  EXPECT_TRUE(policy.StepComplete(View(0, workers)));
  workers[2].live = true;
  workers[2].done = true;  // nor is a finished one
  EXPECT_TRUE(policy.StepComplete(View(0, workers)));
}

TEST(SyncPolicyTest, AWorkerThatPushedAndFinishedStillCounts) {
  SyncPolicy policy(0);
  std::vector<WorkerProgress> workers(3);
  workers[0].pushed = true;
  workers[0].done = true;
  workers[1].pushed = true;
  EXPECT_FALSE(policy.StepComplete(View(0, workers)));  // worker 2 is live and not done
  workers[2].pushed = true;
  EXPECT_TRUE(policy.StepComplete(View(0, workers)));
}

TEST(SyncPolicyTest, ReplicasToAggregateMakesTheRestBackups) {
  SyncPolicy policy(2);
  std::vector<WorkerProgress> workers(3);
  workers[2].pushed = true;
  EXPECT_FALSE(policy.StepComplete(View(0, workers)));
  workers[0].pushed = true;
  EXPECT_TRUE(policy.StepComplete(View(0, workers)));
  // With fewer live workers than wanted, the live ones are enough.
  std::vector<WorkerProgress> alone(3);
  alone[1].live = alone[2].live = false;
  alone[0].pushed = true;
  EXPECT_TRUE(policy.StepComplete(View(0, alone)));
}

TEST(SyncPolicyTest, PullsWaitForTheStepTheyPushedFor) {
  SyncPolicy policy(0);
  std::vector<WorkerProgress> workers(2);
  workers[1].clock = 100;  // clocks do not matter
  EXPECT_EQ(policy.MinVersionAfterPush(4), 5);
  EXPECT_FALSE(policy.PullMayProceed(View(4, workers), 0, 5));
  EXPECT_TRUE(policy.PullMayProceed(View(5, workers), 0, 5));
  EXPECT_FALSE(policy.AnswerMayStreamDuringPush(0, 4));
}

}  // namespace PST_FILE_ID
}  // namespace pst
