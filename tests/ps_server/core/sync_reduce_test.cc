// StageMean: the SYNC mean, summed in rank order and staged through the
// optimizer, is bitwise the same however many threads share a variable.
#include "ps_server/core/sync_reduce.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

constexpr size_t kLarge = 3 * kParallelElements + 123;  // split, with a ragged end

std::unique_ptr<VariableStore> AdamStore(const std::vector<float>& initial) {
  OptimizerConfig config;
  config.mutable_adam()->set_learning_rate(0.01f);
  auto store = std::make_unique<VariableStore>(std::move(*MakeOptimizer(config)));
  google::protobuf::RepeatedPtrField<Tensor> tensors;
  EncodeTensor("w", std::vector<int64_t>{static_cast<int64_t>(initial.size())}, initial,
               tensors.Add());
  EXPECT_TRUE(store->Initialize(tensors).ok());
  return store;
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(rng);
  return v;
}

TEST(SyncReduceTest, EverySplitGivesTheOneThreadResultBitwise) {
  const std::vector<float> initial = Random(kLarge, 1);
  const std::vector<std::vector<float>> ranks = {Random(kLarge, 2), Random(kLarge, 3),
                                                 Random(kLarge, 4)};
  const std::vector<std::span<const float>> gradients(ranks.begin(), ranks.end());
  // The reference: 0 + g0 + g1 + g2, times 1/3, then Adam, element by element.
  std::vector<float> mean(kLarge, 0.0f);
  for (const std::vector<float>& g : ranks) {
    for (size_t i = 0; i < kLarge; ++i) mean[i] += g[i];
  }
  for (float& x : mean) x *= 1.0f / 3;
  std::vector<float> expected = initial;
  std::vector<float> slots(2 * kLarge, 0.0f);
  AdamStore({0})->optimizer().Apply(1, 1.0f, expected, mean, slots);

  ThreadPool threads;
  for (int parts : {1, 2, 3, 4, 7}) {
    SCOPED_TRACE(absl::StrCat(parts, " parts"));
    auto store = AdamStore(initial);
    ASSERT_TRUE(StageMean(store.get(), 0, gradients, 1.0f / 3, {}, &threads, parts).ok());
    store->Commit();
    ASSERT_EQ(*store->variable(0).values, expected);
    EXPECT_EQ(store->variable(0).slots, slots);
  }
}

TEST(SyncReduceTest, AMeanThatOverflowsIsRefusedInAnyPart) {
  std::vector<float> initial(kLarge, 1.0f);
  std::vector<float> huge(kLarge, 0.0f);
  huge[kLarge - 5] = 3e38f;  // in the last part: 3e38 + 3e38 overflows
  const std::vector<std::span<const float>> gradients = {huge, huge};
  ThreadPool threads;
  auto store = AdamStore(initial);
  absl::Status staged = StageMean(store.get(), 0, gradients, 0.5f, {}, &threads, 4);
  EXPECT_EQ(staged.code(), absl::StatusCode::kInvalidArgument) << staged;
  store->Discard();
  store->Commit();
  EXPECT_EQ(*store->variable(0).values, initial);
}

}  // namespace PST_FILE_ID
}  // namespace pst
