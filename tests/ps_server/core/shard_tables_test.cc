// The shard's tables taken as one (ps_server/core/shard_tables.h): a push is
// checked, staged, landed and committed in every table at once or in none,
// the model share and a checkpoint's shard are checked before any table
// changes, and the bytes follow the contents.
#include "ps_server/core/shard_tables.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

ShardOptions SgdOptions(int workers) {
  ShardOptions options;
  options.num_workers = workers;
  options.optimizer.mutable_sgd()->set_learning_rate(0.5f);
  return options;
}

std::unique_ptr<Optimizer> SgdOptimizer(const ShardOptions& options) {
  return std::move(*MakeOptimizer(options.optimizer));
}

InitRequest InitOf(const std::vector<float>& a, const std::vector<float>& b) {
  InitRequest init;
  EncodeTensor("a", std::vector<int64_t>{static_cast<int64_t>(a.size())}, a,
               init.add_variables());
  EncodeTensor("b", std::vector<int64_t>{static_cast<int64_t>(b.size())}, b,
               init.add_variables());
  return init;
}

PushRequest PushOf(int worker, const std::vector<float>& a, const std::vector<float>& b) {
  PushRequest push;
  push.set_worker(worker);
  EncodeTensor("a", std::vector<int64_t>{static_cast<int64_t>(a.size())}, a,
               push.add_gradients());
  EncodeTensor("b", std::vector<int64_t>{static_cast<int64_t>(b.size())}, b,
               push.add_gradients());
  return push;
}

// Every dense variable's values, in order, as a checkpoint holds them.
std::vector<float> ValuesOf(const ShardTables& tables) {
  ShardCheckpoint checkpoint;
  tables.Export(&checkpoint);
  std::vector<float> values;
  for (const ShardCheckpoint::Variable& v : checkpoint.variables()) {
    std::vector<float> out(v.values().size() / sizeof(float));
    std::memcpy(out.data(), v.values().data(), v.values().size());
    values.insert(values.end(), out.begin(), out.end());
  }
  return values;
}

TEST(ShardTablesTest, InitializeGivesEveryTableItsContentsAndCountsTheirBytes) {
  const ShardOptions options = SgdOptions(1);
  ShardTables tables(options, SgdOptimizer(options));
  EXPECT_FALSE(tables.initialized());
  EXPECT_EQ(tables.parameter_bytes(), 0);
  ASSERT_TRUE(tables.Initialize(InitOf({1, 2}, {3})).ok());
  EXPECT_TRUE(tables.initialized());
  EXPECT_TRUE(tables.dense().initialized());
  EXPECT_TRUE(tables.embeddings().initialized());
  EXPECT_EQ(tables.parameter_bytes(), 3 * static_cast<int64_t>(sizeof(float)));
}

TEST(ShardTablesTest, AnInitThatIsNotTheShardsShareOfTheModelChangesNoTable) {
  ShardOptions options = SgdOptions(1);
  ConfigModel model;
  model.variables = {{"a", {2}}, {"b", {1}}};
  options.model = model;
  ShardTables tables(options, SgdOptimizer(options));
  EXPECT_EQ(tables.Initialize(InitOf({1, 2, 3}, {4})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tables.dense().initialized());
  EXPECT_FALSE(tables.embeddings().initialized());
  EXPECT_EQ(tables.parameter_bytes(), 0);
  EXPECT_TRUE(tables.Initialize(InitOf({1, 2}, {3})).ok());
}

TEST(ShardTablesTest, ACheckpointOfAnotherShardChangesNoTable) {
  const ShardOptions options = SgdOptions(1);
  ShardTables source(options, SgdOptimizer(options));
  ASSERT_TRUE(source.Initialize(InitOf({1, 2}, {3})).ok());
  ShardCheckpoint checkpoint;
  source.Export(&checkpoint);
  checkpoint.set_shard(1);
  ShardTables restored(options, SgdOptimizer(options));
  EXPECT_EQ(restored.Restore(checkpoint).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(restored.dense().initialized());
  checkpoint.set_shard(0);
  ASSERT_TRUE(restored.Restore(checkpoint).ok());
  EXPECT_EQ(ValuesOf(restored), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(restored.parameter_bytes(), source.parameter_bytes());
}

TEST(ShardTablesTest, AStagedPushIsVisibleOnlyOnceCommitted) {
  const ShardOptions options = SgdOptions(1);
  ShardTables tables(options, SgdOptimizer(options));
  ASSERT_TRUE(tables.Initialize(InitOf({1, 2}, {3})).ok());
  const PushRequest push = PushOf(0, {2, 2}, {4});
  std::vector<TablePush> plans;
  ASSERT_TRUE(tables.CheckPush(push, /*require_all=*/true, {}, &plans).ok());
  EXPECT_EQ(plans.size(), 2u);  // one per table

  ASSERT_TRUE(tables.Stage(push, plans, {}, /*clip_norm=*/0.0f).ok());
  tables.Discard();
  EXPECT_EQ(ValuesOf(tables), (std::vector<float>{1, 2, 3}));

  ASSERT_TRUE(tables.Stage(push, plans, {}, /*clip_norm=*/0.0f).ok());
  EXPECT_EQ(ValuesOf(tables), (std::vector<float>{1, 2, 3}));
  tables.Commit();
  EXPECT_EQ(ValuesOf(tables), (std::vector<float>{0, 1, 1}));
}

TEST(ShardTablesTest, APushATableRefusesIsRefusedWhole) {
  const ShardOptions options = SgdOptions(1);
  ShardTables tables(options, SgdOptimizer(options));
  ASSERT_TRUE(tables.Initialize(InitOf({1, 2}, {3})).ok());
  std::vector<TablePush> plans;
  EXPECT_EQ(tables.CheckPush(PushOf(0, {1, 1, 1}, {1}), true, {}, &plans).code(),
            absl::StatusCode::kInvalidArgument);  // a's shape
  PushRequest not_finite = PushOf(0, {1, std::nanf("")}, {1});
  EXPECT_EQ(tables.CheckPush(not_finite, true, {}, &plans).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValuesOf(tables), (std::vector<float>{1, 2, 3}));
}

TEST(ShardTablesTest, AStepAppliesTheMeanOfTheRanksThatLanded) {
  const ShardOptions options = SgdOptions(2);
  ShardTables tables(options, SgdOptimizer(options));
  ASSERT_TRUE(tables.Initialize(InitOf({1, 2}, {3})).ok());
  const PushRequest first = PushOf(0, {2, 0}, {2});
  const PushRequest second = PushOf(1, {0, 2}, {6});
  std::vector<TablePush> first_plans, second_plans;
  ASSERT_TRUE(tables.CheckPush(first, true, {}, &first_plans).ok());
  ASSERT_TRUE(tables.CheckPush(second, true, {}, &second_plans).ok());
  tables.Land(1, second, second_plans);
  tables.Land(0, first, first_plans);
  ASSERT_TRUE(tables.StageStep({}, 0.0f).ok());
  tables.Commit();
  // Mean gradient {1, 1}, {4}; SGD at 0.5.
  EXPECT_EQ(ValuesOf(tables), (std::vector<float>{0.5f, 1.5f, 1}));
}

}  // namespace PST_FILE_ID
}  // namespace pst
