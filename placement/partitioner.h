// Where each variable lives: a deterministic placement of variables on PS
// shards that every process computes identically from the same variable
// list, so no placement table is ever exchanged.
#ifndef PST_PLACEMENT_PARTITIONER_H_
#define PST_PLACEMENT_PARTITIONER_H_

#include <cstdint>
#include <vector>

namespace pst {

// Greedy balance by size: variables in decreasing size (ties by position)
// each go to the least-loaded shard so far (ties to the lowest index).
// Returns the shard of each variable, indexed like `sizes`.
std::vector<int> PlaceVariables(const std::vector<int64_t>& sizes, int num_shards);

}  // namespace pst

#endif  // PST_PLACEMENT_PARTITIONER_H_
