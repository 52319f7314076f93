// VariableStore's update contract: staged updates are all or nothing, and
// values a pull has taken a reference to never change under it.
#include "ps_server/core/variable_store.h"

#include <vector>

#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

std::unique_ptr<VariableStore> StoreWith(std::vector<float> initial) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(1.0f);
  auto store = std::make_unique<VariableStore>(std::move(*MakeOptimizer(config)));
  google::protobuf::RepeatedPtrField<Tensor> tensors;
  EncodeTensor("w", std::vector<int64_t>{static_cast<int64_t>(initial.size())}, initial,
               tensors.Add());
  EXPECT_TRUE(store->Initialize(tensors).ok());
  return store;
}

TEST(VariableStoreTest, ValuesHeldByAPullSurviveLaterUpdatesUnchanged) {
  auto store = StoreWith({1, 2, 3, 4, 5});
  const Values held = store->variable(0).values;  // what a pull in flight holds
  const std::vector<float> gradient(5, 1.0f);
  for (int update = 0; update < 3; ++update) {
    ASSERT_TRUE(store->Stage(0, gradient, {}).ok());
    store->Commit();
  }
  EXPECT_EQ(*held, (std::vector<float>{1, 2, 3, 4, 5}));
  EXPECT_EQ(*store->variable(0).values, (std::vector<float>{-2, -1, 0, 1, 2}));
}

TEST(VariableStoreTest, UnheldBuffersAreReusedFromUpdateToUpdate) {
  auto store = StoreWith(std::vector<float>(1000, 1.0f));
  const std::vector<float> gradient(1000, 0.5f);
  ASSERT_TRUE(store->Stage(0, gradient, {}).ok());
  store->Commit();
  const float* first = store->variable(0).values->data();
  ASSERT_TRUE(store->Stage(0, gradient, {}).ok());
  store->Commit();
  ASSERT_TRUE(store->Stage(0, gradient, {}).ok());
  store->Commit();
  EXPECT_EQ(store->variable(0).values->data(), first);  // two buffers, swapped
  EXPECT_EQ((*store->variable(0).values)[999], -0.5f);
}

// A checkpoint's capture copies the variables into memory sized before the
// shard's lock was taken (PresizeExport), and writes what a plain Export does.
TEST(VariableStoreTest, AnExportIntoPresizedVariablesCopiesIntoTheirMemory) {
  OptimizerConfig momentum;
  momentum.mutable_sgd()->set_learning_rate(0.5f);
  momentum.mutable_sgd()->set_momentum(0.9f);
  VariableStore store(std::move(*MakeOptimizer(momentum)));
  google::protobuf::RepeatedPtrField<Tensor> tensors;
  EncodeTensor("w", std::vector<int64_t>{1000}, std::vector<float>(1000, 2.0f), tensors.Add());
  ASSERT_TRUE(store.Initialize(tensors).ok());
  ASSERT_TRUE(store.Stage(0, std::vector<float>(1000, 1.0f), {}).ok());
  store.Commit();
  ShardCheckpoint presized;
  VariableStore::PresizeExport(store.ExportBytes(), &presized);
  ASSERT_EQ(presized.variables_size(), 1);
  const char* values = presized.variables(0).values().data();
  const char* slots = presized.variables(0).slots().data();
  store.Export(&presized);
  EXPECT_EQ(presized.variables(0).values().data(), values);
  EXPECT_EQ(presized.variables(0).slots().data(), slots);
  ShardCheckpoint plain;
  store.Export(&plain);
  EXPECT_EQ(presized.SerializeAsString(), plain.SerializeAsString());
}

// Presized for another set of variables (an Init came between), the export
// still holds the store's variables alone.
TEST(VariableStoreTest, AnExportFitsPresizedVariablesOfAnotherCountToTheStore) {
  auto store = StoreWith({1, 2, 3});
  ShardCheckpoint plain;
  store->Export(&plain);
  ShardCheckpoint more;
  VariableStore::PresizeExport({{4, 0}, {8, 0}, {16, 4}}, &more);
  store->Export(&more);
  EXPECT_EQ(more.SerializeAsString(), plain.SerializeAsString());
  ShardCheckpoint none;
  VariableStore::PresizeExport({}, &none);
  store->Export(&none);
  EXPECT_EQ(none.SerializeAsString(), plain.SerializeAsString());
}

TEST(VariableStoreTest, AnUpdateThatWouldOverflowLeavesTheValuesAsTheyWere) {
  auto store = StoreWith({3e38f, 2});
  absl::Status staged = store->Stage(0, std::vector<float>{-3e38f, 1}, {});  // 6e38: Inf
  EXPECT_EQ(staged.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(staged.message().find("element 0"), std::string::npos) << staged;
  store->Discard();
  store->Commit();  // nothing staged survives a Discard
  EXPECT_EQ(*store->variable(0).values, (std::vector<float>{3e38f, 2}));
  EXPECT_EQ(store->variable(0).updates, 0);
}

}  // namespace PST_FILE_ID
}  // namespace pst
