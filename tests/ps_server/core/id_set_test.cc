// IdSet: a set of ids in parts, as one set.
#include "ps_server/core/id_set.h"

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

}  // namespace PST_FILE_ID
}  // namespace pst
