// Pooled embedding lookups ("bags") and their backward pass, as the Kernels
// backends compute them, plus the CPU reference both follow.
//
// A batch's bags index rows of a small matrix of its unique ids' rows
// (num_rows x dim, one row per unique id, as pulled from the PS): bag b is
// the entries [offsets[b], offsets[b+1]); entry e reads row slots[e] with
// weight weights[e]. Forward, bag b's pooled vector is
//   sum over its entries of weights[e] * rows[slots[e]], times 1 (kSum) or
//   1 / (its entry count) (kMean; an empty bag pools to zeros either way),
// and lies at out + (b / bags_per_row) * row_stride + (b % bags_per_row) * dim,
// so that the bags of one example fill a row of the model's input beside
// its dense features. Backward, row r's gradient is the sum, over the
// entries that read it in entry order, of weights[e] * scale(bag) *
// out_grad(bag): the gradient aggregated per unique id, which is what the
// PS wants pushed. The GPU kernels sum in the same order, so they agree with
// the CPU to float rounding, deterministically (no atomics).
#ifndef PST_KERNELS_EMBEDDING_BAGS_H_
#define PST_KERNELS_EMBEDDING_BAGS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace pst {

enum class PoolingKind { kSum, kMean };

struct EmbeddingBags {
  PoolingKind pooling = PoolingKind::kSum;
  int num_rows = 0;
  std::vector<int32_t> offsets = {0};  // [bags + 1]
  std::vector<int32_t> slots;          // [entries], each in [0, num_rows)
  std::vector<float> weights;          // [entries]
  int bags_per_row = 1;
  int row_stride = 0;  // floats between output rows; 0 = bags_per_row * dim
  // The transpose, filled by Finish(): row r is read by entries
  // row_entries[row_offsets[r] .. row_offsets[r+1]), in increasing order;
  // entry e belongs to bag entry_bags[e].
  std::vector<int32_t> row_offsets;
  std::vector<int32_t> row_entries;
  std::vector<int32_t> entry_bags;

  int num_bags() const { return static_cast<int>(offsets.size()) - 1; }
  int num_entries() const { return static_cast<int>(slots.size()); }
  // The multiplier of bag b's entries (1, or 1 / count for kMean).
  float Scale(int bag) const {
    const int count = offsets[bag + 1] - offsets[bag];
    return pooling == PoolingKind::kMean && count > 0 ? 1.0f / static_cast<float>(count) : 1.0f;
  }
  // Where bag b's pooled vector starts in the output.
  int64_t OutputOffset(int bag, int dim) const {
    const int stride = row_stride > 0 ? row_stride : bags_per_row * dim;
    return static_cast<int64_t>(bag / bags_per_row) * stride +
           static_cast<int64_t>(bag % bags_per_row) * dim;
  }

  // Checks the bags (offsets ascending from 0 to the entry count, every
  // slot a row, weights one per entry, a layout whose rows do not overlap)
  // and builds the transpose. InvalidArgument saying what is wrong.
  absl::Status Finish(int dim);
  // OK once Finish(dim) has succeeded and the bags have not been changed
  // in size since; what a backend checks before a lookup.
  absl::Status CheckFinished(int dim) const;

 private:
  int finished_dim_ = 0;
};

// The CPU reference. `out` gets every bag's vector (and nothing else);
// `row_grads` ([num_rows, dim]) is overwritten, rows no bag reads with 0.
void PoolBagsOnHost(const EmbeddingBags& bags, int dim, const float* rows, float* out);
void PoolBagsBackwardOnHost(const EmbeddingBags& bags, int dim, const float* out_grad,
                            float* row_grads);

}  // namespace pst

#endif  // PST_KERNELS_EMBEDDING_BAGS_H_
