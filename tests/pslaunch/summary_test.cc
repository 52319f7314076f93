// The run's summary line: what the chief's result says of the run, and the
// epochs of a script's own loop.
#include "pslaunch/summary.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "pslaunch/tasks.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

class SummaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/summary_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
    config_.mutable_cluster()->set_workers(2);
    config_.mutable_training()->set_epochs(15);
  }

  void WriteResult(int worker, const WorkerResult& result) {
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(result, &json).ok());
    std::ofstream(WorkerResultPath(dir_, worker)) << json;
  }

  void WriteResults(int chief_epochs, int64_t samples_each = 100) {
    WorkerResult chief;
    chief.set_samples(samples_each);
    chief.set_train_seconds(1.0);
    chief.set_final_version(8);
    chief.set_epochs(chief_epochs);
    WriteResult(0, chief);
    WorkerResult other;
    other.set_samples(samples_each);
    other.set_train_seconds(2.0);
    WriteResult(1, other);
  }

  RunSummary Summary() {
    absl::StatusOr<RunSummary> summary = Summarize(config_, dir_, absl::Now(), {});
    EXPECT_TRUE(summary.ok()) << summary.status();
    return summary.value_or(RunSummary());
  }

  std::string dir_;
  JobConfig config_;
};

TEST_F(SummaryTest, AJobOfTheWorkerBinaryRunsTheConfigsEpochs) {
  WriteResults(/*chief_epochs=*/0);
  const RunSummary summary = Summary();
  EXPECT_EQ(summary.epochs(), 15);
  EXPECT_EQ(summary.steps(), 8);
  EXPECT_DOUBLE_EQ(summary.train_samples_per_sec(), 100.0);  // 200 samples over the longest 2 s
  EXPECT_THAT(SummaryLine(summary), HasSubstr("\"epochs\":15,\"steps\":8,"));
}

TEST_F(SummaryTest, AScriptsEpochsAreTheChiefsPassesOverItsData) {
  config_.mutable_cluster()->set_worker_command("python3 train.py --epochs=3");
  WriteResults(/*chief_epochs=*/3);
  EXPECT_THAT(SummaryLine(Summary()), HasSubstr("\"epochs\":3,\"steps\":8,"));
}

TEST_F(SummaryTest, AScriptThatSaysNoEpochsHasThemUnknown) {
  config_.mutable_cluster()->set_worker_command("python3 train.py");
  WriteResults(/*chief_epochs=*/0);
  EXPECT_THAT(SummaryLine(Summary()), HasSubstr("\"epochs\":null,\"steps\":8,"));
}

TEST_F(SummaryTest, AScriptThatCountsNoSamplesHasItsSpeedUnknown) {
  config_.mutable_cluster()->set_worker_command("python3 train.py");
  WriteResults(/*chief_epochs=*/0, /*samples_each=*/0);
  EXPECT_THAT(SummaryLine(Summary()), HasSubstr("\"train_samples_per_sec\":null,"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
