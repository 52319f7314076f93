#include "consistency/consistency_policy.h"

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(ConsistencyPolicyTest, MakesThePolicyOfEachMode) {
  for (Mode mode : {SYNC, ASYNC, SSP}) {
    absl::StatusOr<std::unique_ptr<ConsistencyPolicy>> policy =
        MakeConsistencyPolicy({.mode = mode, .num_workers = 2});
    ASSERT_TRUE(policy.ok()) << policy.status();
    EXPECT_EQ((*policy)->PushCarriesEveryVariable(), mode == SYNC);
  }
}

TEST(ConsistencyPolicyTest, RefusesBadOptions) {
  EXPECT_EQ(MakeConsistencyPolicy({.mode = MODE_UNSPECIFIED}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConsistencyPolicy({.mode = SYNC, .num_workers = 2, .replicas_to_aggregate = 3})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConsistencyPolicy({.mode = SYNC, .num_workers = 2, .replicas_to_aggregate = -1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConsistencyPolicyTest, OptionsComeFromTheJobConfig) {
  JobConfig config;
  config.mutable_cluster()->set_workers(4);
  TrainingConfig& training = *config.mutable_training();
  training.set_mode(SSP);
  training.set_replicas_to_aggregate(3);
  training.set_staleness(2);
  training.set_staleness_lr_scaling(true);
  training.set_max_staleness(6);
  ConsistencyOptions options = ConsistencyOptionsFromConfig(config);
  EXPECT_EQ(options.mode, SSP);
  EXPECT_EQ(options.num_workers, 4);
  EXPECT_EQ(options.replicas_to_aggregate, 3);
  EXPECT_EQ(options.staleness, 2);
  EXPECT_TRUE(options.staleness_lr_scaling);
  EXPECT_EQ(options.max_staleness, 6);
}

}  // namespace PST_FILE_ID
}  // namespace pst
