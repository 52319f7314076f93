// Pooled embedding lookups on the CPU backend against hand-computed values,
// the backward pass against its definition, and the bags' checks.
#include "kernels/embedding_bags.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

// Three rows of dim 2; two examples of two fields; example 0's field 1 is
// empty, example 1's field 0 reads row 2 twice (a multi-valued field).
EmbeddingBags ThreeRowBags(PoolingKind pooling) {
  EmbeddingBags bags;
  bags.pooling = pooling;
  bags.num_rows = 3;
  bags.offsets = {0, 1, 1, 4, 5};
  bags.slots = {0, 2, 1, 2, 1};
  bags.weights = {1.0f, 2.0f, 1.0f, 0.5f, 3.0f};
  bags.bags_per_row = 2;
  bags.row_stride = 5;  // each example's input row: 2 fields x 2, then one dense feature
  return bags;
}

const std::vector<float> kRows = {1, 2, 10, 20, 100, 200};

TEST(EmbeddingBagsTest, SumAndMeanPoolIntoTheirPlaceInTheInputRow) {
  auto kernels = MakeCpuKernels();
  for (PoolingKind pooling : {PoolingKind::kSum, PoolingKind::kMean}) {
    EmbeddingBags bags = ThreeRowBags(pooling);
    ASSERT_TRUE(bags.Finish(2).ok());
    std::vector<float> out(10, -7.0f);
    ASSERT_TRUE(kernels->EmbeddingBagsForward(bags, 2, kRows.data(), out.data()).ok());
    if (pooling == PoolingKind::kSum) {
      // bag 2 = 2*row2 + row1 + 0.5*row2 = 2.5*(100,200) + (10,20)
      EXPECT_THAT(out, ElementsAre(1, 2, 0, 0, -7, 260, 520, 30, 60, -7));
    } else {
      EXPECT_THAT(out, ElementsAre(1, 2, 0, 0, -7, FloatNear(260.0f / 3, 1e-4), FloatNear(520.0f / 3, 1e-4),
                                   30, 60, -7));
    }
  }
}

TEST(EmbeddingBagsTest, TheBackwardAggregatesEachRowsGradientOverItsEntries) {
  auto kernels = MakeCpuKernels();
  const std::vector<float> out_grad = {1, 1, 5, 5, 9, 0.5f, 1, 2, 4, 9};
  for (PoolingKind pooling : {PoolingKind::kSum, PoolingKind::kMean}) {
    EmbeddingBags bags = ThreeRowBags(pooling);
    ASSERT_TRUE(bags.Finish(2).ok());
    std::vector<float> grads(6, -7.0f);
    ASSERT_TRUE(kernels->EmbeddingBagsBackward(bags, 2, out_grad.data(), grads.data()).ok());
    const float s = pooling == PoolingKind::kMean ? 1.0f / 3 : 1.0f;
    // row 0: bag 0; row 1: bag 2 (weight 1) and bag 3 (weight 3); row 2: bag 2 (2 + 0.5).
    EXPECT_THAT(grads, ElementsAre(1, 1, FloatNear(s * 0.5f + 3 * 2, 1e-5),
                                   FloatNear(s * 1 + 3 * 4, 1e-5), FloatNear(2.5f * s * 0.5f, 1e-5),
                                   FloatNear(2.5f * s * 1, 1e-5)));
  }
}

TEST(EmbeddingBagsTest, BadBagsAreRefusedBeforeAnyLookup) {
  auto kernels = MakeCpuKernels();
  EmbeddingBags unfinished = ThreeRowBags(PoolingKind::kSum);
  std::vector<float> out(10);
  EXPECT_THAT(std::string(kernels->EmbeddingBagsForward(unfinished, 2, kRows.data(), out.data())
                              .message()),
              HasSubstr("finished"));
  EmbeddingBags bad_slot = ThreeRowBags(PoolingKind::kSum);
  bad_slot.slots[1] = 3;
  EXPECT_THAT(std::string(bad_slot.Finish(2).message()), HasSubstr("row 3 of 3"));
  EmbeddingBags overlapping = ThreeRowBags(PoolingKind::kSum);
  overlapping.row_stride = 3;
  EXPECT_FALSE(overlapping.Finish(2).ok());
  EmbeddingBags short_offsets = ThreeRowBags(PoolingKind::kSum);
  short_offsets.offsets.back() = 4;
  EXPECT_FALSE(short_offsets.Finish(2).ok());
  EmbeddingBags other_dim = ThreeRowBags(PoolingKind::kSum);
  ASSERT_TRUE(other_dim.Finish(2).ok());
  EXPECT_FALSE(kernels->EmbeddingBagsForward(other_dim, 1, kRows.data(), out.data()).ok());
}

TEST(SigmoidCrossEntropyTest, MatchesHandValuesAndCountsSigns) {
  auto kernels = MakeCpuKernels();
  const std::vector<float> logits = {0.0f, 2.0f, -3.0f, 40.0f};
  const std::vector<float> labels = {1.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> d(4);
  ASSERT_TRUE(kernels->SigmoidCrossEntropy(4, logits.data(), labels.data(), d.data()).ok());
  ASSERT_TRUE(kernels->Synchronize().ok());
  absl::StatusOr<LossResult> loss = kernels->TakeLoss();
  ASSERT_TRUE(loss.ok());
  const double expected =
      (std::log(2.0) + std::log1p(std::exp(2.0)) + std::log1p(std::exp(-3.0)) +
       std::log1p(std::exp(-40.0))) / 4;
  EXPECT_NEAR(loss->loss, expected, 1e-9);
  EXPECT_EQ(loss->correct, 2);  // rows 2 and 3; a logit of 0 predicts no click
  EXPECT_FLOAT_EQ(d[0], (0.5f - 1.0f) / 4);
  EXPECT_FLOAT_EQ(d[1], static_cast<float>(1.0 / (1.0 + std::exp(-2.0))) / 4);
  EXPECT_FLOAT_EQ(d[3], 0.0f);
  EXPECT_FALSE(kernels->SigmoidCrossEntropy(0, logits.data(), labels.data(), d.data()).ok());
}

}  // namespace PST_FILE_ID
}  // namespace pst
