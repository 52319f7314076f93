// Column sums of a row-major matrix (the bias gradient: out[c] = sum over r
// of m[r, c]) as the CUDA backend computes them, and the same computation on
// the CPU.
//
// The plan splits the rows into row blocks as well as the columns into
// tiles, so a narrow matrix (the 10-wide output layer's gradient over a
// batch) still spreads over many blocks. The summation order is fixed by the
// plan alone, never by scheduling, so a result is bitwise reproducible:
//   1. block b covers rows [b * rows_per_block, min(rows, (b + 1) *
//      rows_per_block)); in it, lane y (0 <= y < kColumnSumsRowLanes) sums
//      rows first + y, first + y + kColumnSumsRowLanes, ... in increasing
//      order, starting from 0.0f;
//   2. the block's sum is 0.0f + lane 0 + lane 1 + ... + lane 7, in order;
//   3. with one row block that is out[c]; otherwise out[c] = 0.0f + block 0
//      + block 1 + ..., in order.
// Every addition is a float addition. ColumnSumsReference follows these steps
// exactly, so it reproduces the CUDA kernels' result bit for bit.
//
// Plain C++17 with no dependencies: nvcc compiles this header too.
#ifndef PST_KERNELS_COLUMN_SUMS_H_
#define PST_KERNELS_COLUMN_SUMS_H_

#include <cstddef>
#include <cstdint>

namespace pst {

// A block is kColumnSumsTileCols x kColumnSumsRowLanes threads: consecutive
// columns across a warp, so loads are coalesced.
inline constexpr int kColumnSumsTileCols = 32;
inline constexpr int kColumnSumsRowLanes = 8;
// Fewer rows than this per block costs more in the second pass than it saves.
inline constexpr int64_t kColumnSumsMinRowsPerBlock = 32;
inline constexpr int64_t kColumnSumsMaxRowBlocks = 128;
// Floats of partial sums (row_blocks x cols) the backend sets aside.
inline constexpr int64_t kColumnSumsScratch = int64_t{1} << 18;

struct ColumnSumsPlan {
  int64_t row_blocks = 1;      // >= 1; 1 = a single pass straight into out
  int64_t rows_per_block = 0;  // a positive multiple of kColumnSumsRowLanes
};

// For rows >= 0 and cols >= 1. Every row block holds at least one row
// (when rows > 0), and row_blocks x cols partial sums fit the scratch.
constexpr ColumnSumsPlan PlanColumnSums(int rows, int cols) {
  const int64_t r = rows > 0 ? rows : 0;
  int64_t blocks = (r + kColumnSumsMinRowsPerBlock - 1) / kColumnSumsMinRowsPerBlock;
  if (blocks > kColumnSumsMaxRowBlocks) blocks = kColumnSumsMaxRowBlocks;
  const int64_t fit = cols > 0 ? kColumnSumsScratch / cols : kColumnSumsMaxRowBlocks;
  if (blocks > fit) blocks = fit;
  if (blocks < 1) blocks = 1;
  int64_t per_block = (r + blocks - 1) / blocks;
  per_block = (per_block + kColumnSumsRowLanes - 1) / kColumnSumsRowLanes * kColumnSumsRowLanes;
  if (per_block < kColumnSumsRowLanes) per_block = kColumnSumsRowLanes;
  blocks = (r + per_block - 1) / per_block;  // rounding per_block up may leave fewer
  if (blocks < 1) blocks = 1;
  return ColumnSumsPlan{blocks, per_block};
}

// out[c] for 0 <= c < cols, summed in exactly the order above. Does nothing
// when rows < 0 or cols < 1.
void ColumnSumsReference(int rows, int cols, const float* m, float* out);

}  // namespace pst

#endif  // PST_KERNELS_COLUMN_SUMS_H_
