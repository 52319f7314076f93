#include "kernels/column_major_gemm.h"

namespace pst {

ColumnMajorGemm ToColumnMajorGemm(bool transpose_a, bool transpose_b, int m, int n, int k) {
  return ToColumnMajorGemm(transpose_a, transpose_b, m, n, k,
                           DenseLeadingDimension(transpose_a, m, k),
                           DenseLeadingDimension(transpose_b, k, n), n);
}

ColumnMajorGemm ToColumnMajorGemm(bool transpose_a, bool transpose_b, int m, int n, int k,
                                  int lda, int ldb, int ldc) {
  // B as stored reads column-major as its transpose (n x k when not
  // transposed, k x n when it is), with its row stride as the leading
  // dimension; likewise A. Transposing the stored matrix undoes that, so
  // the operand's transpose flag carries over unchanged.
  return ColumnMajorGemm{
      .transpose_first = transpose_b,
      .transpose_second = transpose_a,
      .m = n,
      .n = m,
      .k = k,
      .ld_first = ldb,
      .ld_second = lda,
      .ld_c = ldc,
  };
}

bool StridesCoverWidths(bool transpose_a, bool transpose_b, int m, int n, int k, int lda,
                        int ldb, int ldc) {
  return lda >= DenseLeadingDimension(transpose_a, m, k) &&
         ldb >= DenseLeadingDimension(transpose_b, k, n) && ldc >= n;
}

}  // namespace pst
