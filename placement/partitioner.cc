#include "placement/partitioner.h"

#include <algorithm>
#include <numeric>

namespace pst {

std::vector<int> PlaceVariables(const std::vector<int64_t>& sizes, int num_shards) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&sizes](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int64_t> load(num_shards, 0);
  std::vector<int> shard_of(sizes.size(), 0);
  for (size_t v : order) {
    int lightest = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    shard_of[v] = lightest;
    load[lightest] += sizes[v];
  }
  return shard_of;
}

}  // namespace pst
