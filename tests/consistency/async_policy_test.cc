#include "consistency/async_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using Action = Admission::Action;

ShardView View(int64_t version, const std::vector<WorkerProgress>& workers) {
  return {.version = version, .workers = workers};
}

TEST(AsyncPolicyTest, AppliesEveryPushAtFullRateByDefault) {
  AsyncPolicy policy(/*staleness_lr_scaling=*/false, /*max_staleness=*/0);
  std::vector<WorkerProgress> workers(2);
  for (int64_t computed_at : {0, 5, 10}) {
    absl::StatusOr<Admission> admission = policy.AdmitPush(View(10, workers), 1, computed_at);
    ASSERT_TRUE(admission.ok());
    EXPECT_EQ(admission->action, Action::kApply);
    EXPECT_EQ(admission->lr_scale, 1.0f);
  }
  EXPECT_FALSE(policy.PushCarriesEveryVariable());
  workers[0].pushed = true;
  EXPECT_FALSE(policy.StepComplete(View(10, workers)));
}

TEST(AsyncPolicyTest, ScalesTheLearningRateByStaleness) {
  AsyncPolicy policy(/*staleness_lr_scaling=*/true, /*max_staleness=*/0);
  std::vector<WorkerProgress> workers(1);
  EXPECT_EQ(policy.AdmitPush(View(7, workers), 0, 7)->lr_scale, 1.0f);
  EXPECT_EQ(policy.AdmitPush(View(7, workers), 0, 4)->lr_scale, 0.25f);
}

TEST(AsyncPolicyTest, DropsPushesPastMaxStaleness) {
  AsyncPolicy policy(/*staleness_lr_scaling=*/false, /*max_staleness=*/2);
  std::vector<WorkerProgress> workers(1);
  EXPECT_EQ(policy.AdmitPush(View(7, workers), 0, 5)->action, Action::kApply);
  EXPECT_EQ(policy.AdmitPush(View(7, workers), 0, 4)->action, Action::kDrop);
}

TEST(AsyncPolicyTest, PullsWaitOnlyForTheVersionTheyAskFor) {
  AsyncPolicy policy(false, 0);
  std::vector<WorkerProgress> workers(2);
  workers[0].clock = 50;  // far ahead of worker 1: no matter
  EXPECT_TRUE(policy.PullMayProceed(View(3, workers), 0, 3));
  EXPECT_FALSE(policy.PullMayProceed(View(3, workers), 0, 4));
  EXPECT_EQ(policy.MinVersionAfterPush(3), 3);
}

TEST(AsyncPolicyTest, AnswersStreamWhenTheCommittedPushIsEnough) {
  AsyncPolicy policy(false, 0);
  EXPECT_TRUE(policy.AnswerMayStreamDuringPush(4, 3));
  EXPECT_TRUE(policy.AnswerMayStreamDuringPush(0, 3));
  EXPECT_FALSE(policy.AnswerMayStreamDuringPush(5, 3));
}

}  // namespace PST_FILE_ID
}  // namespace pst
