// The row-major -> column-major operand mapping both BLAS backends share.
// The CPU Gemm tests run it through CBLAS; here, its fields for each layout.
#include "kernels/column_major_gemm.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(ColumnMajorGemmTest, SwapsTheOperandsAndDimensionsForEveryLayout) {
  struct Case {
    bool ta, tb;
    int ld_first, ld_second;
  };
  // c[m=2, n=3] = op(a)[2, k=5] op(b)[5, 3].
  for (Case c : {Case{false, false, 3, 5}, Case{true, false, 3, 2}, Case{false, true, 5, 5},
                 Case{true, true, 5, 2}}) {
    SCOPED_TRACE(absl::StrCat("ta=", c.ta, " tb=", c.tb));
    const ColumnMajorGemm call = ToColumnMajorGemm(c.ta, c.tb, 2, 3, 5);
    EXPECT_EQ(call.transpose_first, c.tb);
    EXPECT_EQ(call.transpose_second, c.ta);
    EXPECT_EQ(call.m, 3);
    EXPECT_EQ(call.n, 2);
    EXPECT_EQ(call.k, 5);
    EXPECT_EQ(call.ld_first, c.ld_first);
    EXPECT_EQ(call.ld_second, c.ld_second);
    EXPECT_EQ(call.ld_c, 3);
  }
}

TEST(ColumnMajorGemmTest, BlocksOfWiderMatricesKeepTheirStridesAsLeadingDimensions) {
  const ColumnMajorGemm call = ToColumnMajorGemm(true, false, 2, 3, 5, 11, 13, 17);
  EXPECT_EQ(call.ld_first, 13);   // b's row stride
  EXPECT_EQ(call.ld_second, 11);  // a's
  EXPECT_EQ(call.ld_c, 17);
  EXPECT_EQ(call.m, 3);
  EXPECT_EQ(call.n, 2);
}

TEST(ColumnMajorGemmTest, StridesMustCoverTheWidthOfEachMatrixAsStored) {
  // c[2, 3] = op(a)[2, 5] op(b)[5, 3]: a stored 2 x 5 (5 x 2 transposed).
  EXPECT_TRUE(StridesCoverWidths(false, false, 2, 3, 5, 5, 3, 3));
  EXPECT_FALSE(StridesCoverWidths(false, false, 2, 3, 5, 4, 3, 3));
  EXPECT_TRUE(StridesCoverWidths(true, false, 2, 3, 5, 2, 3, 3));
  EXPECT_FALSE(StridesCoverWidths(false, true, 2, 3, 5, 5, 4, 3));
  EXPECT_TRUE(StridesCoverWidths(false, true, 2, 3, 5, 5, 5, 3));
  EXPECT_FALSE(StridesCoverWidths(false, false, 2, 3, 5, 5, 3, 2));
}

}  // namespace PST_FILE_ID
}  // namespace pst
