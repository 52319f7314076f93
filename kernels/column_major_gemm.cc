#include "kernels/column_major_gemm.h"

namespace pst {

ColumnMajorGemm ToColumnMajorGemm(bool transpose_a, bool transpose_b, int m, int n, int k) {
  // B as stored reads column-major as an n x k matrix (leading dimension n)
  // when not transposed, as a k x n one (leading dimension k) when it is;
  // likewise A with m. Transposing the stored matrix undoes that, so the
  // operand's transpose flag carries over unchanged.
  return ColumnMajorGemm{
      .transpose_first = transpose_b,
      .transpose_second = transpose_a,
      .m = n,
      .n = m,
      .k = k,
      .ld_first = transpose_b ? k : n,
      .ld_second = transpose_a ? m : k,
      .ld_c = n,
  };
}

}  // namespace pst
