#include "kernels/column_sums.h"

#include <algorithm>
#include <vector>

namespace pst {

void ColumnSumsReference(int rows, int cols, const float* m, float* out) {
  if (rows < 0 || cols < 1) return;
  const ColumnSumsPlan plan = PlanColumnSums(rows, cols);
  const size_t width = static_cast<size_t>(cols);
  // Rows are walked in memory order, each added to its lane's running sums:
  // per column, that is still each lane's rows in increasing order.
  std::vector<float> lanes(kColumnSumsRowLanes * width);
  std::vector<float> blocks(static_cast<size_t>(plan.row_blocks) * width);
  for (int64_t b = 0; b < plan.row_blocks; ++b) {
    std::fill(lanes.begin(), lanes.end(), 0.0f);
    const int64_t first = b * plan.rows_per_block;
    const int64_t end = std::min<int64_t>(rows, first + plan.rows_per_block);
    for (int64_t r = first; r < end; ++r) {
      float* lane = lanes.data() + static_cast<size_t>((r - first) % kColumnSumsRowLanes) * width;
      const float* row = m + static_cast<size_t>(r) * width;
      for (size_t c = 0; c < width; ++c) lane[c] += row[c];
    }
    float* block = blocks.data() + static_cast<size_t>(b) * width;
    for (size_t c = 0; c < width; ++c) {
      float total = 0.0f;
      for (int y = 0; y < kColumnSumsRowLanes; ++y) total += lanes[y * width + c];
      block[c] = total;
    }
  }
  if (plan.row_blocks == 1) {
    std::copy(blocks.begin(), blocks.end(), out);
    return;
  }
  for (size_t c = 0; c < width; ++c) {
    float total = 0.0f;
    for (int64_t b = 0; b < plan.row_blocks; ++b) total += blocks[static_cast<size_t>(b) * width + c];
    out[c] = total;
  }
}

}  // namespace pst
