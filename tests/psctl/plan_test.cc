#include "psctl/plan.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/ctr_config.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// Round numbers, so that every term can be followed by hand.
constexpr CostConstants kHand{.alpha_s = 1e-3, .beta_s = 0.5e-3, .eta_w = 1, .fill = 1,
                              .eta_s = 2, .gamma_s_per_byte = 1e-9, .eta_y = 2};

PlanJob HandJob(Mode mode) {
  PlanJob job;
  job.workers = 4;
  job.mode = mode;
  job.batch_size = 64;
  job.dense_wire_bytes = 4e6;
  job.link_bytes_per_s = 1e9;
  job.rtt_s = 0.1e-3;
  job.compute_s = 5e-3;
  return job;
}

// K = 2, the busiest shard holding half: it takes 4 x 0.5 x 4 MB = 8 MB each
// way, 2 x 8 MB / (2 x 1 GB/s) = 8 ms. messages = 1 + 2 x 0.5 + 0.1 ms;
// fill = min(4 MB, 2 MiB) / 1 GB/s.
TEST(StepSecondsTest, SyncAddsComputeMessagesTheBusiestPortFillAndApply) {
  const double fill_ms = 2.0 * 1048576 / 1e6;
  const double expected_ms = 5 + 2.1 + 8 + fill_ms + 8;  // compute, messages, 8 MB, fill, 8 MB x 1 ns
  EXPECT_NEAR(StepSeconds(kHand, HandJob(SYNC), 2, 0.5) * 1e3, expected_ms, 1e-9);
}

// ASYNC: the worker's own path (5 + 2.1 + 4 + fill = 13.2 ms) is shorter than
// the busiest shard's queue (2 x 8 MB / (2 x 1 GB/s) + 8 ms = 16 ms).
TEST(StepSecondsTest, AsyncIsTheLongerOfTheWorkersPathAndTheBusiestShardsQueue) {
  EXPECT_NEAR(StepSeconds(kHand, HandJob(ASYNC), 2, 0.5) * 1e3, 16.0, 1e-9);
  PlanJob one = HandJob(ASYNC);
  one.workers = 1;  // the shard's queue: 2 x 2 MB / 2 GB/s + 2 ms = 4 ms < the worker's path
  const double fill_ms = 2.0 * 1048576 / 1e6;
  EXPECT_NEAR(StepSeconds(kHand, one, 2, 0.5) * 1e3, 5 + 2.1 + 4 + fill_ms, 1e-9);
}

JobConfig LocalConfig() {
  JobConfig config;
  TrainingConfig* training = config.mutable_training();
  training->mutable_dataset()->mutable_fashion_mnist();
  training->mutable_model()->mutable_mlp()->add_hidden(256);
  training->mutable_model()->mutable_mlp()->add_hidden(128);
  return config;
}

// 784*256 + 256 + 256*128 + 128 + 128*10 + 10.
TEST(ModelVariablesTest, TheMlpOfTheDefaultJob) {
  absl::StatusOr<std::vector<VariableSpec>> variables = ModelVariables(LocalConfig().training());
  ASSERT_TRUE(variables.ok()) << variables.status();
  int64_t parameters = 0;
  for (const VariableSpec& v : *variables) parameters += v.size();
  EXPECT_EQ(parameters, 235146);
  EXPECT_EQ(variables->size(), 6u);
}

// The click model of configs/ctr.textproto: its MLP over the pooled rows
// and the dense features, as the config's own count has it.
TEST(ModelVariablesTest, TheClickModelsMlp) {
  absl::StatusOr<JobConfig> config =
      LoadJobConfig(std::string(PST_SOURCE_DIR) + "/configs/ctr.textproto", {});
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::vector<VariableSpec>> variables = ModelVariables(config->training());
  ASSERT_TRUE(variables.ok()) << variables.status();
  int64_t parameters = 0;
  for (const VariableSpec& v : *variables) parameters += v.size();
  EXPECT_EQ(parameters, CtrDenseParameterCount(config->training()));
  EXPECT_GT(parameters, 0);
}

// Two shards: the two kernels are cut in halves (100352 and 16384 floats
// each), then the small pieces go, largest first, to the lighter shard:
// 1280 to ps:0 (118016), 256, 128 and 10 to ps:1 (117130).
TEST(BusiestShardShareTest, FollowsThePlacementOfTheDenseModel) {
  absl::StatusOr<std::vector<VariableSpec>> variables = ModelVariables(LocalConfig().training());
  ASSERT_TRUE(variables.ok());
  EXPECT_DOUBLE_EQ(BusiestShardShare(*variables, 235146 * 4.0, 0, 1), 1.0);
  EXPECT_NEAR(BusiestShardShare(*variables, 235146 * 4.0, 0, 2), 118016.0 / 235146, 1e-12);
  // Embedding rows spread evenly: a model of rows alone is 1/K per shard.
  EXPECT_NEAR(BusiestShardShare({}, 0, 1e6, 4), 0.25, 1e-12);
}

// No costs but the links: 8 workers of 8 MB, SYNC, 1 GB/s, a port's two
// directions fully overlapped (eta_y = 2). Up to 8 shards the busiest
// shard's port (64 MB / K) decides; from 8 on, each worker's own (8 MB), so
// K = 8..16 tie at 8 ms and 8 is the smallest within 5%.
TEST(PlanTest, RecommendsTheSmallestShardCountWithinFivePercentOfTheBest) {
  const CostConstants links_only{.eta_w = 1, .fill = 0, .eta_s = 1, .eta_y = 2};
  PlanJob job;
  job.workers = 8;
  job.mode = SYNC;
  job.batch_size = 100;
  job.embedding_wire_bytes = 8e6;
  job.link_bytes_per_s = 1e9;
  std::vector<PlanRow> rows = Plan(links_only, job, {}, 16);
  ASSERT_EQ(rows.size(), 16u);
  EXPECT_NEAR(rows[0].step_s, 64e-3, 1e-12);
  EXPECT_NEAR(rows[3].step_s, 16e-3, 1e-12);
  EXPECT_NEAR(rows[15].step_s, 8e-3, 1e-12);
  EXPECT_NEAR(rows[7].samples_per_s, 8 * 100 / 8e-3, 1e-6);
  EXPECT_EQ(Recommend(rows, 0.05).shards, 8);
}

// The default job's 0.94 MB model with 2 workers: the fit has no fixed
// cost per shard, so every shard up to 16 looked a little faster and 6 or 7
// were recommended; past one per worker a shard's port carries less than a
// worker's own, and the recommendation stops there.
TEST(PlanTest, RecommendsNoMoreShardsThanTheStepHasBytesToSplit) {
  PlanJob job;
  job.workers = 2;
  job.mode = SYNC;
  job.batch_size = 64;
  job.dense_wire_bytes = 235146 * 4.0;
  job.link_bytes_per_s = 10e9 / 8;
  job.compute_s = 1e-3;
  const std::vector<VariableSpec> mlp = {{"dense_0/kernel", {784, 256}}, {"dense_0/bias", {256}},
                                         {"dense_1/kernel", {256, 128}}, {"dense_1/bias", {128}},
                                         {"dense_2/kernel", {128, 10}},  {"dense_2/bias", {10}}};
  const std::vector<PlanRow> rows = Plan(FittedConstants(), job, mlp, 16);
  ASSERT_GT(rows.size(), 2u);
  EXPECT_GT(Recommend(rows, 0.05).shards, 2);
  EXPECT_EQ(UsefulShards(job), 2);
  EXPECT_EQ(Recommend(rows, 0.05, UsefulShards(job)).shards, 2);
}

TEST(PlanTest, TheToleranceAdmitsASmallerClusterThatIsNearlyAsFast) {
  const std::vector<PlanRow> rows = {{.shards = 1, .samples_per_s = 100},
                                     {.shards = 2, .samples_per_s = 190},
                                     {.shards = 3, .samples_per_s = 200},
                                     {.shards = 4, .samples_per_s = 196}};
  EXPECT_EQ(Recommend(rows, 0.05).shards, 2);
  EXPECT_EQ(Recommend(rows, 0.01).shards, 3);
}

TEST(ParseTest, RatesAndTimesWithTheirUnits) {
  EXPECT_DOUBLE_EQ(*ParseLinkBytesPerSecond("25gbit"), 25e9 / 8);
  EXPECT_DOUBLE_EQ(*ParseLinkBytesPerSecond("200mbit"), 25e6);
  EXPECT_DOUBLE_EQ(*ParseSeconds("100us"), 100e-6);
  EXPECT_DOUBLE_EQ(*ParseSeconds("2ms"), 2e-3);
  EXPECT_DOUBLE_EQ(*ParseSeconds("1s"), 1.0);
  for (const char* bad : {"25", "25gb", "fast", "-1gbit", "0gbit"}) {
    EXPECT_EQ(ParseLinkBytesPerSecond(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_EQ(ParseSeconds("100").status().code(), absl::StatusCode::kInvalidArgument);
}

// The constants psctl uses are the ones the fit wrote.
TEST(FittedConstantsTest, AreTheConstantsRowOfTheNamespaceBenchmark) {
  std::ifstream file(std::string(PST_SOURCE_DIR) + "/docs/bench/netns_cluster.json");
  ASSERT_TRUE(file) << "docs/bench/netns_cluster.json is missing";
  std::string line, last;
  while (std::getline(file, line)) {
    if (line.find("\"constants\"") != std::string::npos) last = line;
  }
  google::protobuf::Struct row;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(last, &row).ok()) << last;
  const auto& c = row.fields().at("constants").struct_value().fields();
  const CostConstants fitted = FittedConstants();
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, double>>{{"alpha", fitted.alpha_s},
                                                   {"beta", fitted.beta_s},
                                                   {"eta_w", fitted.eta_w},
                                                   {"fill", fitted.fill},
                                                   {"eta_s", fitted.eta_s},
                                                   {"gamma", fitted.gamma_s_per_byte},
                                                   {"eta_y", fitted.eta_y}}) {
    const double json = c.at(name).number_value();
    EXPECT_NEAR(value, json, 1e-6 * std::max(1.0, std::abs(json))) << name;
  }
}

std::string Psctl() { return std::string(PST_BIN_DIR) + "/psctl"; }

TEST(PsctlPlanTest, PrintsSixteenShardCountsTheRecommendationAndTheAssumptions) {
  CommandResult run = RunCommand(
      absl::StrCat(Psctl(), " plan --config=", PST_SOURCE_DIR,
                   "/configs/local.textproto --workers=64 --link=25gbit --rtt=100us "
                   "--worker_step_ms=5"),
      60);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u + 1 + 16 + 2) << run.out;
  EXPECT_THAT(lines[0], HasSubstr("64 worker(s), sync, batch 64, 235146 dense parameters"));
  EXPECT_THAT(lines[2], HasSubstr("     1 "));
  EXPECT_THAT(lines[17], HasSubstr("    16 "));
  EXPECT_THAT(lines[18], HasSubstr("recommended: "));
  EXPECT_THAT(lines[19], HasSubstr("assumptions: "));
}

TEST(PsctlPlanTest, BadInputIsOneLineAndExitCodeTwo) {
  const std::string config = absl::StrCat(" --config=", PST_SOURCE_DIR, "/configs/local.textproto");
  for (const char* flags : {" --link=25gb --worker_step_ms=5", " --worker_step_ms=5",
                            " --link=25gbit", " --link=25gbit --worker_step_ms=5 --rtt=soon"}) {
    CommandResult run = RunCommand(absl::StrCat(Psctl(), " plan", config, flags), 60);
    EXPECT_EQ(run.exit_code, 2) << flags << ": " << run.err;
    EXPECT_THAT(run.err, HasSubstr("psctl")) << flags;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
