#include "placement/partitioner.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(PartitionerTest, OneShardTakesEverything) {
  EXPECT_EQ(PlaceVariables({5, 1, 9}, 1), (std::vector<int>{0, 0, 0}));
}

TEST(PartitionerTest, IsDeterministicAndBalancesBySize) {
  // An MLP 784-256-128-10: kernels and biases.
  std::vector<int64_t> sizes = {784 * 256, 256, 256 * 128, 128, 128 * 10, 10};
  std::vector<int> first = PlaceVariables(sizes, 2);
  EXPECT_EQ(first, PlaceVariables(sizes, 2));
  std::vector<int64_t> load(2, 0);
  for (size_t i = 0; i < sizes.size(); ++i) load[first[i]] += sizes[i];
  // The big kernel alone on one shard, everything else on the other.
  EXPECT_EQ(first[0], 0);
  EXPECT_EQ(load[1], 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST(PartitionerTest, EqualSizesSpreadRoundRobin) {
  EXPECT_EQ(PlaceVariables({4, 4, 4, 4, 4, 4}, 3), (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

}  // namespace PST_FILE_ID
}  // namespace pst
