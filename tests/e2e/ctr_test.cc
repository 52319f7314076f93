// configs/ctr.textproto as a user runs it, scaled down: pslaunch with 2 PS
// shards and 2 workers trains the CTR model on data the workers generate
// on first use, in each mode, and the chief's summary reports a test AUC
// well above chance and near the planted model's own.
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "result.pb.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The shipped config with ports the system picks, its data in `dir`, and
// fewer examples seen twice, so that a run takes seconds.
std::string SmallCtrConfig(const std::string& dir) {
  std::string text = ReadFile(absl::StrCat(PST_SOURCE_DIR, "/configs/ctr.textproto"));
  const int replaced = absl::StrReplaceAll(
      {{"127.0.0.1:50061", "127.0.0.1:0"},
       {"127.0.0.1:50062", "127.0.0.1:0"},
       {"/tmp/pstrain-ctr", dir},
       {"train_examples: 500000", "train_examples: 60000"},
       {"test_examples: 50000", "test_examples: 10000"},
       {"distinct: 100000", "distinct: 20000"},
       {"epochs: 1", "epochs: 2"}},
      &text);
  EXPECT_EQ(replaced, 8) << "configs/ctr.textproto changed: update this test's replacements";
  const std::string path = absl::StrCat(dir, "/ctr.textproto");
  std::ofstream(path) << text;
  return path;
}

// The number after `key` in `text`.
double NumberAfter(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  std::string rest = text.substr(at + key.size(), 12);
  rest = rest.substr(0, rest.find_first_not_of("0123456789."));
  double value = -1;
  return absl::SimpleAtod(rest, &value) ? value : -1;
}

class CtrLaunchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CtrLaunchTest, TrainsTheClickModelToNearThePlantedAuc) {
  const std::string dir = absl::StrCat(ScratchDir(), "/ctr_", GetParam());
  std::filesystem::create_directories(dir);
  // The generated files take tens of MB: gone however the test ends.
  struct RemoveAtEnd {
    std::string dir;
    ~RemoveAtEnd() { std::filesystem::remove_all(dir); }
  } remove_at_end{dir};
  const std::string config = SmallCtrConfig(dir);
  CommandResult run = RunCommand(
      absl::StrCat(Bin("pslaunch"), " --config=", config, " --mode=", GetParam()), 500);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string all = run.out + run.err;
  EXPECT_THAT(all, HasSubstr("generating"));  // on first use
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir, "/train.tsv")));
  const double planted = NumberAfter(all, "the planted model scores test_auc ");
  ASSERT_GT(planted, 0.7) << all;

  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines.back(), &summary).ok())
      << lines.back();
  EXPECT_THAT(lines.back(), HasSubstr("\"test_auc\":"));
  EXPECT_THAT(lines.back(), HasSubstr("\"test_logloss\":"));
  EXPECT_GT(summary.steps(), 0);
  EXPECT_GT(summary.test_auc(), 0.65);
  EXPECT_GT(summary.test_auc(), planted - 0.05) << "planted " << planted;
  EXPECT_LT(summary.test_auc(), planted + 0.01);
  EXPECT_GT(summary.test_logloss(), 0.0);
  EXPECT_LT(summary.test_logloss(), 0.6);
}

INSTANTIATE_TEST_SUITE_P(EveryMode, CtrLaunchTest, ::testing::Values("sync", "async", "ssp"));

// Both tables with RAM for 2 000 rows a shard and the rest on disk (kept
// as one table of parts, as all in RAM: CtrShardTables): SYNC trains
// bitwise as all in RAM, so the summary's AUC and loss are the all-in-RAM
// run's to the last digit, and the shards read cold rows ahead of the
// steps that train them.
TEST(CtrTiersTest, ADiskTierTrainsAsAllInRamAndReadsAhead) {
  const std::string dir = absl::StrCat(ScratchDir(), "/ctr_tiers");
  std::filesystem::create_directories(dir);
  struct RemoveAtEnd {
    std::string dir;
    ~RemoveAtEnd() { std::filesystem::remove_all(dir); }
  } remove_at_end{dir};
  const std::string ram = SmallCtrConfig(dir);
  std::string text = ReadFile(ram);
  // The memory rule: dim x 4 x (1 + 1 Adagrad slot) + 50 bytes a row.
  const int replaced = absl::StrReplaceAll(
      {{"embeddings { name: \"categorical\" dim: 8",
        absl::StrCat("embeddings { storage { memory_bytes: ", 2000 * (8 * 8 + 50), " disk: \"", dir,
                     "/tiers\" } name: \"categorical\" dim: 8")},
       {"embeddings { name: \"wide\" dim: 1",
        absl::StrCat("embeddings { storage { memory_bytes: ", 2000 * (8 + 50), " disk: \"", dir,
                     "/tiers\" } name: \"wide\" dim: 1")}},
      &text);
  ASSERT_EQ(replaced, 2) << "configs/ctr.textproto changed: update this test's replacements";
  const std::string tiered = absl::StrCat(dir, "/ctr_tiers.textproto");
  std::ofstream(tiered) << text;

  std::vector<std::string> summaries;
  std::string tiered_output;
  for (const std::string& config : {ram, tiered}) {
    CommandResult run =
        RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", config, " --mode=sync"), 500);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
    ASSERT_FALSE(lines.empty());
    RunSummary summary;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines.back(), &summary).ok());
    summaries.push_back(
        absl::StrCat(summary.test_auc(), " ", summary.test_logloss(), " ", summary.steps()));
    tiered_output = run.out + run.err;
  }
  EXPECT_EQ(summaries[1], summaries[0]);
  // Each shard's line at exit: far more rows than RAM holds went to disk,
  // and some reads that missed RAM found their row read ahead.
  for (int shard = 0; shard < 2; ++shard) {
    std::string line;
    for (absl::string_view l : absl::StrSplit(tiered_output, '\n')) {
      if (absl::StartsWith(l, absl::StrCat("[ps:", shard, "]")) &&
          absl::StrContains(l, "table categorical+wide: ")) {
        line = std::string(l);
      }
    }
    ASSERT_FALSE(line.empty()) << tiered_output;
    EXPECT_GT(NumberAfter(line, " in RAM, "), 10000) << line;
    EXPECT_GT(NumberAfter(line, "waited for the disk, "), 0) << line;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
