// The rates a push carries (UpdateRates: a torch optimizer's param groups)
// and the gradient clipping: which update they apply to, in SYNC whose they
// are, what is refused, and the optimizer an Init names, kept across a
// checkpoint.
#include <cmath>
#include <vector>

#include "parameter_shard_testing.h"

namespace pst {
namespace PST_FILE_ID {

using shard_testing::Gradient;
using shard_testing::InitTwoVariables;
using shard_testing::MakeShard;
using shard_testing::Options;
using shard_testing::PullValues;

PushRequest WithRates(PushRequest push, float w_lr, float b_lr) {
  (*push.mutable_rates()->mutable_learning_rates())["w"] = w_lr;
  (*push.mutable_rates()->mutable_learning_rates())["b"] = b_lr;
  return push;
}

TEST(ParameterShardRatesTest, AnAsyncPushAppliesItsOwnRatesAndOnlyToItself) {
  auto shard = MakeShard(ASYNC, 1, /*lr=*/1.0f);
  InitTwoVariables(shard.get());
  PushResponse response;
  PushRequest push = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
  (*push.mutable_rates()->mutable_learning_rates())["w"] = 0.5f;  // b: the config's
  ASSERT_TRUE(Push(*shard, push, &response).ok());
  EXPECT_EQ(PullValues(shard.get(), "w"), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
  EXPECT_EQ(PullValues(shard.get(), "b"), (std::vector<float>{-1, -1}));
  ASSERT_TRUE(Push(*shard, Gradient(0, 1, {1, 1, 1, 1}, {0, 0}), &response).ok());
  EXPECT_EQ(PullValues(shard.get(), "w"), (std::vector<float>{-0.5f, 0.5f, 1.5f, 2.5f}));
}

TEST(ParameterShardRatesTest, ASyncStepAppliesItsLowestRankedPushsRatesWhateverArrivesFirst) {
  for (bool rank0_first : {true, false}) {
    SCOPED_TRACE(rank0_first ? "rank 0 first" : "rank 1 first");
    auto shard = MakeShard(SYNC, 2, /*lr=*/1.0f);
    InitTwoVariables(shard.get());
    const PushRequest rank0 = WithRates(Gradient(0, 0, {2, 2, 2, 2}, {2, 2}), 0.25f, 0.5f);
    const PushRequest rank1 = WithRates(Gradient(1, 0, {2, 2, 2, 2}, {2, 2}), 9.0f, 9.0f);
    PushResponse response;
    ASSERT_TRUE(Push(*shard, rank0_first ? rank0 : rank1, &response).ok());
    ASSERT_TRUE(Push(*shard, rank0_first ? rank1 : rank0, &response).ok());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
    EXPECT_EQ(PullValues(shard.get(), "w"), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));
    EXPECT_EQ(PullValues(shard.get(), "b"), (std::vector<float>{-1, -1}));
  }
}

TEST(ParameterShardRatesTest, ASyncStepsMeanIsClippedToTheBoundItsPushNames) {
  auto shard = MakeShard(SYNC, 2, /*lr=*/1.0f);
  InitTwoVariables(shard.get());
  // The mean: w {3, 0, 0, 0}, b {0, 4}: norm 5, clipped to 1.
  PushRequest rank0 = Gradient(0, 0, {6, 0, 0, 0}, {0, 0});
  rank0.mutable_rates()->set_clip_norm(1.0f);
  PushResponse response;
  ASSERT_TRUE(Push(*shard, rank0, &response).ok());
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {0, 0, 0, 0}, {0, 8}), &response).ok());
  const std::vector<float> w = PullValues(shard.get(), "w");
  const std::vector<float> b = PullValues(shard.get(), "b");
  EXPECT_NEAR(w[0], 1.0f - 0.6f, 1e-6);
  EXPECT_EQ(w[1], 2.0f);
  EXPECT_NEAR(b[1], -0.8f, 1e-6);
}

TEST(ParameterShardRatesTest, AnAsyncPushIsClippedByTheConfigsBoundUnlessItNamesItsOwn) {
  ShardOptions options = Options(ASYNC, 1, /*lr=*/1.0f);
  options.optimizer.set_clip_norm(2.5f);
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {3, 0, 0, 0}, {4, 0}), &response).ok());  // norm 5
  EXPECT_NEAR(PullValues(shard.get(), "w")[0], 1.0f - 1.5f, 1e-6);
  // A gradient within the bound goes unscaled; a push's 0 turns clipping off.
  ASSERT_TRUE(Push(*shard, Gradient(0, 1, {1, 0, 0, 0}, {0, 0}), &response).ok());
  EXPECT_NEAR(PullValues(shard.get(), "w")[0], -0.5f - 1.0f, 1e-6);
  PushRequest unclipped = Gradient(0, 2, {30, 0, 0, 0}, {40, 0});
  unclipped.mutable_rates()->set_clip_norm(0.0f);
  ASSERT_TRUE(Push(*shard, unclipped, &response).ok());
  EXPECT_NEAR(PullValues(shard.get(), "w")[0], -1.5f - 30.0f, 1e-5);
}

TEST(ParameterShardRatesTest, BadRatesAreRefusedAndChangeNothing) {
  auto shard = MakeShard(ASYNC, 1, /*lr=*/1.0f);
  InitTwoVariables(shard.get());
  std::vector<PushRequest> bad(4, Gradient(0, 0, {1, 1, 1, 1}, {1, 1}));
  (*bad[0].mutable_rates()->mutable_learning_rates())["w"] = -0.1f;
  (*bad[1].mutable_rates()->mutable_weight_decays())["b"] = NAN;
  (*bad[2].mutable_rates()->mutable_learning_rates())["nowhere"] = 0.1f;
  bad[3].mutable_rates()->set_clip_norm(-1.0f);
  for (const PushRequest& push : bad) {
    PushResponse response;
    EXPECT_EQ(Push(*shard, push, &response).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(PullValues(shard.get(), "w"), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(shard_testing::StatsOf(shard.get()).version(), 0);
}

TEST(ParameterShardRatesTest, TheOptimizerAnInitNamesTrainsTheVariablesAndTravelsInCheckpoints) {
  auto shard = MakeShard(ASYNC, 1, /*lr=*/1.0f);  // the job's: SGD
  InitRequest init;
  shard_testing::AddTensor("w", {1}, {2.0f}, init.mutable_variables());
  init.mutable_optimizer()->mutable_adamw()->set_learning_rate(0.1f);
  init.mutable_optimizer()->mutable_adamw()->set_weight_decay(0.5f);
  InitResponse accepted;
  ASSERT_TRUE(shard->Init(init, &accepted).ok());
  PushRequest push;
  push.set_worker(0);
  shard_testing::AddTensor("w", {1}, {0.0f}, push.mutable_gradients());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, push, &response).ok());
  // AdamW on a zero gradient: the decay alone (SGD would leave 2).
  EXPECT_FLOAT_EQ(PullValues(shard.get(), "w")[0], 2.0f * (1.0f - 0.1f * 0.5f));

  const ShardCheckpoint checkpoint = shard->Snapshot();
  EXPECT_TRUE(checkpoint.has_dense_optimizer());
  auto restored = MakeShard(ASYNC, 1, /*lr=*/1.0f);
  ASSERT_TRUE(restored->Restore(checkpoint).ok());
  push.set_computed_at_version(1);
  ASSERT_TRUE(Push(*restored, push, &response).ok());
  ASSERT_TRUE(Push(*shard, push, &response).ok());
  EXPECT_EQ(PullValues(restored.get(), "w"), PullValues(shard.get(), "w"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
