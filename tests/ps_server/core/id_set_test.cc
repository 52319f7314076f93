// IdSet: a set of ids in parts, as one set; IdSieve: its Bloom filter.
#include "ps_server/core/id_set.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;

TEST(IdSetTest, HoldsEachIdOnceWhateverItsPart) {
  IdSet ids;
  for (uint64_t id : {5ull, 1ull << 63, 0ull, 5ull, 77ull}) ids.insert(id);
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_TRUE(ids.contains(1ull << 63));
  EXPECT_TRUE(ids.erase(5));
  EXPECT_FALSE(ids.erase(5));
  EXPECT_FALSE(ids.contains(5));
  EXPECT_THAT(ids.Sorted(), ElementsAre(0, 77, 1ull << 63));
}

TEST(IdSetTest, MovedOutItLeavesAnEmptySet) {
  IdSet ids;
  for (uint64_t id = 0; id < 10000; ++id) ids.insert(id * 0x9e3779b97f4a7c15ULL);
  IdSet taken = std::exchange(ids, {});
  EXPECT_EQ(taken.size(), 10000u);
  EXPECT_EQ(ids.size(), 0u);
  ids.insert(3);
  EXPECT_THAT(ids.Sorted(), ElementsAre(3));
  EXPECT_FALSE(taken.contains(3));
}

// Ids as a table holds them: a shard's (the low bits of their hash alike)
// drawn from a wide range.
std::vector<uint64_t> ShardIds(size_t n, uint64_t seed) {
  std::vector<uint64_t> ids;
  for (uint64_t x = seed; ids.size() < n; ++x) {
    const uint64_t id = x * 0x9e3779b97f4a7c15ULL;
    if (RowHash(id) % 4 == 1) ids.push_back(id);
  }
  return ids;
}

TEST(IdSieveTest, HoldsEveryIdOfItsSetAndFewOthers) {
  IdSet changed;
  for (uint64_t id : ShardIds(100000, 1)) changed.insert(id);
  const IdSieve sieve(changed);
  changed.ForEach([&](uint64_t id) { ASSERT_TRUE(sieve.MayHold(id)) << id; });
  size_t yes = 0;
  const std::vector<uint64_t> others = ShardIds(200000, 1u << 30);
  for (uint64_t id : others) {
    if (!changed.contains(id)) yes += sieve.MayHold(id);
  }
  // Two bits of 32 an id: about 0.4 %.
  EXPECT_LT(yes, others.size() / 100);
}

TEST(IdSieveTest, TakesAtMost8MiBWhateverTheSetsSize) {
  IdSet changed;
  for (uint64_t id : ShardIds(2200000, 3)) changed.insert(id);  // 32 bits each: past 2^26
  const IdSieve sieve(changed);
  EXPECT_EQ(sieve.bytes(), size_t{8} << 20);
  changed.ForEach([&](uint64_t id) { ASSERT_TRUE(sieve.MayHold(id)) << id; });
  EXPECT_EQ(IdSieve(IdSet()).bytes(), 8u);
}

TEST(IdSieveTest, OfAnEmptySetHoldsNothing) {
  const IdSieve sieve{IdSet()};
  for (uint64_t id : ShardIds(1000, 7)) EXPECT_FALSE(sieve.MayHold(id));
}

TEST(IdSieveTest, OfOneIdHoldsIt) {
  IdSet one;
  one.insert(1ull << 63);
  const IdSieve sieve(one);
  EXPECT_TRUE(sieve.MayHold(1ull << 63));
}

}  // namespace PST_FILE_ID
}  // namespace pst
