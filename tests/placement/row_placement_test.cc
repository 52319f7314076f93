// Row placement is part of the checkpoint format: a row restored onto a
// shard must hash there. These values pin the hash, so that a change to it
// fails here before it strands the rows of existing checkpoints.
#include "placement/row_placement.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(RowPlacementTest, TheHashIsSplitMix64AndStaysSo) {
  struct Case {
    uint64_t id;
    uint64_t hash;
    int shard_of_2, shard_of_3, shard_of_7;
  };
  // SplitMix64 seeded with 0 yields 0xe220a8397b1dcdaf first: the published
  // reference value, so id 0 checks the formula itself.
  const Case cases[] = {
      {0, 0xe220a8397b1dcdafULL, 1, 1, 2},
      {1, 0x910a2dec89025cc1ULL, 1, 2, 2},
      {2, 0x975835de1c9756ceULL, 0, 1, 4},
      {42, 0xbdd732262feb6e95ULL, 1, 1, 5},
      {uint64_t{1} << 32, 0xc42c5a1aa3820138ULL, 0, 1, 6},
      {~uint64_t{0}, 0xe4d971771b652c20ULL, 0, 2, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.id);
    EXPECT_EQ(RowHash(c.id), c.hash);
    EXPECT_EQ(ShardOfRow(c.id, 1), 0);
    EXPECT_EQ(ShardOfRow(c.id, 2), c.shard_of_2);
    EXPECT_EQ(ShardOfRow(c.id, 3), c.shard_of_3);
    EXPECT_EQ(ShardOfRow(c.id, 7), c.shard_of_7);
  }
}

// Ids come dense (0, 1, 2, ...) or clustered (a field's id in the high
// bits, a value in the low ones, or multiples of a power of two); each
// kind must still spread evenly.
TEST(RowPlacementTest, IdsOfEveryShapeSpreadEvenlyOverTheShards) {
  constexpr int kIds = 120000;
  struct Case {
    const char* name;
    uint64_t stride;
    uint64_t base;
  };
  const Case shapes[] = {
      {"consecutive", 1, 0},
      {"multiples of 1024", 1024, 0},
      {"one field in the high bits", 1, uint64_t{17} << 56},
      {"multiples of 2^32", uint64_t{1} << 32, 5},
  };
  for (const Case& shape : shapes) {
    for (int shards : {2, 3, 4, 7, 16}) {
      SCOPED_TRACE(testing::Message() << shape.name << " over " << shards << " shards");
      std::vector<int> rows(shards, 0);
      for (uint64_t i = 0; i < kIds; ++i) ++rows[ShardOfRow(shape.base + i * shape.stride, shards)];
      const double expected = static_cast<double>(kIds) / shards;
      for (int s = 0; s < shards; ++s) {
        // A uniform spread's standard deviation is below sqrt(expected),
        // about 270 rows here: 3% of `expected` is over 5 of them.
        EXPECT_NEAR(rows[s], expected, 0.03 * expected) << "shard " << s;
      }
    }
  }
}

TEST(RowPlacementTest, NearbyIdsLandOnUnrelatedShards) {
  // Placement must not follow the id's low bits: over 2 shards,
  // consecutive ids change shard about half the time.
  int changes = 0;
  for (uint64_t id = 0; id < 10000; ++id) changes += ShardOfRow(id, 2) != ShardOfRow(id + 1, 2);
  EXPECT_NEAR(changes, 5000, 300);
}

}  // namespace PST_FILE_ID
}  // namespace pst
