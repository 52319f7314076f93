// Which PS shard holds which part of the model. Every process computes the
// same placement from the same variable list, so no placement table is ever
// exchanged, and nothing here talks to a shard.
//
// With several shards, a variable over kSliceBytes is cut along its first
// dimension into one slice per shard ("<name>/part-<i>"), so one big matrix
// does not load one shard alone; slices and small variables are then spread
// by size (placement/partitioner.h). A model too small for that to reach
// every shard has its largest variables cut too, so that no shard is left
// without a part where the model has rows enough.
#ifndef PST_PLACEMENT_PLACEMENT_H_
#define PST_PLACEMENT_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "placement/variable_spec.h"

namespace pst {

// A contiguous piece of one model variable, as one PS shard stores it.
struct VariableSlice {
  size_t variable;  // index into the model's variables
  int64_t offset;   // first element within the variable
  int64_t count;
  std::string name;
  std::vector<int64_t> shape;
  int shard;
};

// Variables larger than this (in float32 bytes) are cut into one slice per
// shard.
inline constexpr int64_t kSliceBytes = 64 << 10;

// The slices of `variables` (in order, each variable's slices in row order,
// together covering every element once) and the shard of each, for a
// cluster of `num_shards` shards.
std::vector<VariableSlice> PlaceModel(const std::vector<VariableSpec>& variables, int num_shards);

// FailedPrecondition, saying to run fewer shards, if one of the
// `num_shards` shards holds none of `slices` (a model with fewer rows in
// all than there are shards): such a shard would never be initialized.
absl::Status CheckEveryShardHoldsASlice(const std::vector<VariableSlice>& slices, int num_shards);

}  // namespace pst

#endif  // PST_PLACEMENT_PLACEMENT_H_
