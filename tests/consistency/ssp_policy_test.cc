#include "consistency/ssp_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using Action = Admission::Action;

ShardView View(int64_t version, const std::vector<WorkerProgress>& workers) {
  return {.version = version, .workers = workers};
}

TEST(SspPolicyTest, AdmitsPushesAsAsyncDoes) {
  SspPolicy policy(/*staleness=*/1, /*staleness_lr_scaling=*/true, /*max_staleness=*/3);
  std::vector<WorkerProgress> workers(2);
  EXPECT_EQ(policy.AdmitPush(View(9, workers), 0, 8)->action, Action::kApply);
  EXPECT_EQ(policy.AdmitPush(View(9, workers), 0, 8)->lr_scale, 0.5f);
  EXPECT_EQ(policy.AdmitPush(View(9, workers), 0, 5)->action, Action::kDrop);
  EXPECT_EQ(policy.MinVersionAfterPush(8), 8);
}

TEST(SspPolicyTest, PullWaitsForTheSlowestLiveWorker) {
  SspPolicy policy(/*staleness=*/1, false, 0);
  std::vector<WorkerProgress> workers(3);
  workers[0].clock = 3;
  workers[1].clock = 2;
  workers[2].clock = 1;
  EXPECT_FALSE(policy.PullMayProceed(View(6, workers), 0, 0));  // 2 ahead of worker 2
  EXPECT_TRUE(policy.PullMayProceed(View(6, workers), 1, 0));   // 1 ahead
  EXPECT_TRUE(policy.PullMayProceed(View(6, workers), 2, 0));
  EXPECT_FALSE(policy.PullMayProceed(View(6, workers), 2, 7));  // the version still counts
}

TEST(SspPolicyTest, SilentAndFinishedWorkersDoNotHoldOthersBack) {
  SspPolicy policy(/*staleness=*/0, false, 0);
  std::vector<WorkerProgress> workers(3);
  workers[0].clock = 5;
  workers[1].clock = 1;
  workers[2].clock = 2;
  workers[1].live = false;
  workers[2].done = true;
  EXPECT_TRUE(policy.PullMayProceed(View(8, workers), 0, 0));
  workers[2].done = false;
  EXPECT_FALSE(policy.PullMayProceed(View(8, workers), 0, 0));
}

TEST(SspPolicyTest, AnswersNeverStreamDuringAPush) {
  SspPolicy policy(/*staleness=*/5, false, 0);
  EXPECT_FALSE(policy.AnswerMayStreamDuringPush(0, 3));
}

}  // namespace PST_FILE_ID
}  // namespace pst
