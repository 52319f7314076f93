#include "placement/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "placement/partitioner.h"

namespace pst {
namespace {

int64_t Rows(const VariableSpec& spec) { return spec.shape.empty() ? 1 : spec.shape[0]; }

// Which variables to cut by rows across the shards: those over
// `slice_bytes`, and then, while there are fewer pieces than shards (a small
// model), the largest of the others that has rows to cut, so that every
// shard holds a part of the model.
std::vector<bool> VariablesToSlice(const std::vector<VariableSpec>& variables, int shards,
                                   int64_t slice_bytes) {
  std::vector<bool> slice(variables.size(), false);
  if (shards <= 1) return slice;
  int64_t pieces = 0;
  for (size_t v = 0; v < variables.size(); ++v) {
    const int64_t rows = Rows(variables[v]);
    slice[v] = rows > 1 && variables[v].size() * static_cast<int64_t>(sizeof(float)) > slice_bytes;
    pieces += slice[v] ? std::min<int64_t>(shards, rows) : 1;
  }
  while (pieces < shards) {
    int largest = -1;
    for (size_t v = 0; v < variables.size(); ++v) {
      if (!slice[v] && Rows(variables[v]) > 1 &&
          (largest < 0 || variables[v].size() > variables[largest].size())) {
        largest = static_cast<int>(v);
      }
    }
    if (largest < 0) break;  // every row is a piece already: CheckEveryShardHoldsASlice says so
    slice[largest] = true;
    pieces += std::min<int64_t>(shards, Rows(variables[largest])) - 1;
  }
  return slice;
}

}  // namespace

std::vector<VariableSlice> PlaceModel(const std::vector<VariableSpec>& variables, int num_shards) {
  std::vector<VariableSlice> slices;
  const std::vector<bool> sliced = VariablesToSlice(variables, num_shards, kSliceBytes);
  for (size_t v = 0; v < variables.size(); ++v) {
    const VariableSpec& spec = variables[v];
    const int64_t rows = Rows(spec);
    const int64_t row_elements = rows > 0 ? spec.size() / rows : 0;
    const int64_t parts = sliced[v] ? std::min<int64_t>(num_shards, rows) : 1;
    int64_t row = 0;
    for (int64_t p = 0; p < parts; ++p) {
      // Rows as even as possible: the first rows % parts slices get one more.
      const int64_t part_rows = rows / parts + (p < rows % parts ? 1 : 0);
      VariableSlice s{v,
                      row * row_elements,
                      part_rows * row_elements,
                      parts == 1 ? spec.name : absl::StrCat(spec.name, "/part-", p),
                      spec.shape,
                      0};
      if (!s.shape.empty()) s.shape[0] = part_rows;
      if (parts == 1) s.count = spec.size();
      slices.push_back(std::move(s));
      row += part_rows;
    }
  }
  std::vector<int64_t> sizes;
  for (const VariableSlice& s : slices) sizes.push_back(s.count);
  std::vector<int> placement = PlaceVariables(sizes, num_shards);
  for (size_t i = 0; i < slices.size(); ++i) slices[i].shard = placement[i];
  return slices;
}

absl::Status CheckEveryShardHoldsASlice(const std::vector<VariableSlice>& slices, int num_shards) {
  std::vector<bool> holds(num_shards, false);
  for (const VariableSlice& s : slices) holds[s.shard] = true;
  for (int s = 0; s < num_shards; ++s) {
    if (!holds[s]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the model is too small to give each of the ", num_shards, " PS shards a part (it has ",
          slices.size(), " pieces in all, ps:", s, " would hold none); run fewer PS shards"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pst
