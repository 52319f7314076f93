// The column-sum plan the CUDA kernels follow, and the CPU reference that
// reproduces their summation order, against the plain sum.
#include "kernels/column_sums.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

struct Shape {
  int rows, cols;
};

// Odd shapes: empty, one column, rows not a multiple of the lanes or the
// block, more columns than a block of threads, more partial sums than the
// scratch holds, and the tall narrow bias gradient of the output layer.
const Shape kShapes[] = {{0, 5},    {1, 1},      {7, 1},     {9, 3},     {33, 10},
                         {64, 10},  {1000, 10},  {1025, 3},  {3, 1025},  {100, 2000},
                         {4097, 7}, {70001, 5},  {5, 300000}, {257, 1}};

TEST(ColumnSumsPlanTest, CoversEveryRowOnceInBlocksThatFitTheScratch) {
  for (Shape s : kShapes) {
    SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols));
    const ColumnSumsPlan plan = PlanColumnSums(s.rows, s.cols);
    EXPECT_GE(plan.row_blocks, 1);
    EXPECT_LE(plan.row_blocks, kColumnSumsMaxRowBlocks);
    EXPECT_GT(plan.rows_per_block, 0);
    EXPECT_EQ(plan.rows_per_block % kColumnSumsRowLanes, 0);
    EXPECT_GE(plan.row_blocks * plan.rows_per_block, s.rows);
    if (s.rows > 0) {
      EXPECT_LT((plan.row_blocks - 1) * plan.rows_per_block, s.rows);
    }
    if (plan.row_blocks > 1) {
      EXPECT_LE(plan.row_blocks * s.cols, kColumnSumsScratch);
    }
  }
}

TEST(ColumnSumsPlanTest, ATallNarrowMatrixSpreadsOverManyBlocks) {
  // The 10-wide output bias gradient of a 1024-row batch: one column tile,
  // so the rows must be what is split.
  EXPECT_GE(PlanColumnSums(1024, 10).row_blocks, 16);
  EXPECT_EQ(PlanColumnSums(60000, 10).row_blocks, kColumnSumsMaxRowBlocks);
  // Small matrices stay in one pass.
  EXPECT_EQ(PlanColumnSums(32, 10).row_blocks, 1);
  EXPECT_EQ(PlanColumnSums(0, 10).row_blocks, 1);
}

// Plain sums in double.
std::vector<double> NaiveSums(const std::vector<float>& m, Shape s) {
  std::vector<double> out(s.cols, 0.0);
  for (int r = 0; r < s.rows; ++r) {
    for (int c = 0; c < s.cols; ++c) out[c] += m[static_cast<size_t>(r) * s.cols + c];
  }
  return out;
}

TEST(ColumnSumsReferenceTest, SmallIntegersSumExactlyWhateverTheOrder) {
  // Integers of at most 8 over at most 70 001 rows stay below 2^24: any
  // summation order is exact, so the reference must equal the plain sum.
  std::mt19937 rng(1);
  for (Shape s : kShapes) {
    SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols));
    std::vector<float> m(static_cast<size_t>(s.rows) * s.cols);
    for (float& v : m) v = static_cast<float>(static_cast<int>(rng() % 17) - 8);
    std::vector<float> out(s.cols, std::numeric_limits<float>::quiet_NaN());
    ColumnSumsReference(s.rows, s.cols, m.data(), out.data());
    const std::vector<double> expected = NaiveSums(m, s);
    for (int c = 0; c < s.cols; ++c) {
      ASSERT_EQ(out[c], expected[c]) << "column " << c;
    }
  }
}

TEST(ColumnSumsReferenceTest, RandomFloatsMatchThePlainSumToRounding) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (Shape s : kShapes) {
    SCOPED_TRACE(absl::StrCat(s.rows, "x", s.cols));
    std::vector<float> m(static_cast<size_t>(s.rows) * s.cols);
    for (float& v : m) v = dist(rng);
    std::vector<float> out(s.cols);
    ColumnSumsReference(s.rows, s.cols, m.data(), out.data());
    const std::vector<double> expected = NaiveSums(m, s);
    // Float rounding of a sum of n terms of magnitude <= 1: well under
    // n * 2^-24 each way.
    const double bound = std::max(1, s.rows) * 0x1.0p-23;
    for (int c = 0; c < s.cols; ++c) {
      ASSERT_NEAR(out[c], expected[c], bound) << "column " << c;
    }
  }
}

TEST(ColumnSumsReferenceTest, FollowsThePlansOrderNotTheRowOrder) {
  // Floats near 1e8 are 8 apart, so 1e8 + 4 rounds (to even) back to 1e8:
  // in row order every 4 after the first row is lost. In the plan (16 rows,
  // one block) lane 0 is 1e8 + 4 = 1e8, lanes 1..7 are 4 + 4 = 8 each, and
  // those add exactly: 1e8 + 7 * 8.
  std::vector<float> m(16, 4.0f);
  m[0] = 1e8f;
  float row_order = 0.0f;
  for (float v : m) row_order += v;
  ASSERT_EQ(row_order, 1e8f);
  float out = 0.0f;
  ColumnSumsReference(16, 1, m.data(), &out);
  EXPECT_EQ(out, 1e8f + 56.0f);
}

}  // namespace PST_FILE_ID
}  // namespace pst
