#include "kernels/embedding_bags.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pst {

absl::Status EmbeddingBags::Finish(int dim) {
  if (dim < 1 || num_rows < 0 || bags_per_row < 1 || row_stride < 0 ||
      (row_stride > 0 && row_stride < bags_per_row * dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding bags of dim ", dim, ", ", num_rows, " rows, ", bags_per_row,
        " bags per output row of stride ", row_stride, ": the layout overlaps or is empty"));
  }
  if (offsets.empty() || offsets.front() != 0 || offsets.back() != num_entries() ||
      weights.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding bags: offsets must run from 0 to the ", slots.size(), " entries, with ",
        weights.size(), " weights for them"));
  }
  for (int b = 0; b < num_bags(); ++b) {
    if (offsets[b + 1] < offsets[b]) {
      return absl::InvalidArgumentError(absl::StrCat("embedding bag ", b, " ends before it starts"));
    }
  }
  row_offsets.assign(static_cast<size_t>(num_rows) + 1, 0);
  for (int32_t slot : slots) {
    if (slot < 0 || slot >= num_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding bags read row ", slot, " of ", num_rows));
    }
    ++row_offsets[slot + 1];
  }
  for (int r = 0; r < num_rows; ++r) row_offsets[r + 1] += row_offsets[r];
  row_entries.resize(slots.size());
  entry_bags.resize(slots.size());
  std::vector<int32_t> next(row_offsets.begin(), row_offsets.end() - 1);
  for (int b = 0; b < num_bags(); ++b) {
    for (int32_t e = offsets[b]; e < offsets[b + 1]; ++e) {
      row_entries[next[slots[e]]++] = e;
      entry_bags[e] = b;
    }
  }
  finished_dim_ = dim;
  return absl::OkStatus();
}

absl::Status EmbeddingBags::CheckFinished(int dim) const {
  if (finished_dim_ != dim || row_offsets.size() != static_cast<size_t>(num_rows) + 1 ||
      entry_bags.size() != slots.size() || row_entries.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding bags must be finished (EmbeddingBags::Finish) for dim ", dim,
        " before a lookup"));
  }
  return absl::OkStatus();
}

void PoolBagsOnHost(const EmbeddingBags& bags, int dim, const float* rows, float* out) {
  for (int b = 0; b < bags.num_bags(); ++b) {
    float* pooled = out + bags.OutputOffset(b, dim);
    std::fill(pooled, pooled + dim, 0.0f);
    for (int32_t e = bags.offsets[b]; e < bags.offsets[b + 1]; ++e) {
      const float* row = rows + static_cast<int64_t>(bags.slots[e]) * dim;
      const float w = bags.weights[e];
      for (int j = 0; j < dim; ++j) pooled[j] += w * row[j];
    }
    const float scale = bags.Scale(b);
    if (scale != 1.0f) {
      for (int j = 0; j < dim; ++j) pooled[j] *= scale;
    }
  }
}

void PoolBagsBackwardOnHost(const EmbeddingBags& bags, int dim, const float* out_grad,
                            float* row_grads) {
  for (int r = 0; r < bags.num_rows; ++r) {
    float* grad = row_grads + static_cast<int64_t>(r) * dim;
    std::fill(grad, grad + dim, 0.0f);
    for (int32_t k = bags.row_offsets[r]; k < bags.row_offsets[r + 1]; ++k) {
      const int32_t e = bags.row_entries[k];
      const int bag = bags.entry_bags[e];
      const float w = bags.weights[e] * bags.Scale(bag);
      const float* g = out_grad + bags.OutputOffset(bag, dim);
      for (int j = 0; j < dim; ++j) grad[j] += w * g[j];
    }
  }
}

}  // namespace pst
