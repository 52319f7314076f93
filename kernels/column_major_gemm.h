// How a row-major product maps onto a column-major BLAS call.
//
// Both backends compute c = alpha op(a) op(b) + beta c on dense row-major
// matrices through a column-major GEMM (cuBLAS on the GPU, CBLAS with
// CblasColMajor on the CPU). A row-major m x n matrix read column-major is
// its n x m transpose, so the call computes C^T = op(B)^T op(A)^T: B goes
// first, A second, and the dimensions swap. Both backends take the call from
// this one function, so the CPU tests exercise the GPU's operand layout.
#ifndef PST_KERNELS_COLUMN_MAJOR_GEMM_H_
#define PST_KERNELS_COLUMN_MAJOR_GEMM_H_

namespace pst {

struct ColumnMajorGemm {
  // The column-major call is gemm(transpose_first, transpose_second, m, n, k,
  // alpha, first, ld_first, second, ld_second, beta, c, ld_c) with first = b
  // and second = a of the row-major product.
  bool transpose_first;
  bool transpose_second;
  int m;  // rows of the column-major C: the row-major n
  int n;  // columns of the column-major C: the row-major m
  int k;
  int ld_first;
  int ld_second;
  int ld_c;
};

// The column-major call for the row-major c[m,n] = op(a)[m,k] op(b)[k,n],
// where a is stored m x k (k x m when transpose_a) and b is stored k x n
// (n x k when transpose_b), each dense.
ColumnMajorGemm ToColumnMajorGemm(bool transpose_a, bool transpose_b, int m, int n, int k);

// The same for operands that are blocks of wider row-major matrices: a's,
// b's and c's rows start lda, ldb and ldc floats apart. A row-major matrix
// with rows ld apart reads column-major with leading dimension ld.
ColumnMajorGemm ToColumnMajorGemm(bool transpose_a, bool transpose_b, int m, int n, int k,
                                  int lda, int ldb, int ldc);

// The row stride of a dense operand whose op() is rows x cols: the width of
// the matrix as stored.
inline int DenseLeadingDimension(bool transposed, int rows, int cols) {
  return transposed ? rows : cols;
}

// Whether every row stride of c[m,n] = op(a)[m,k] op(b)[k,n] is at least the
// width of its matrix as stored (BLAS refuses narrower ones).
bool StridesCoverWidths(bool transpose_a, bool transpose_b, int m, int n, int k, int lda,
                        int ldb, int ldc);

}  // namespace pst

#endif  // PST_KERNELS_COLUMN_MAJOR_GEMM_H_
