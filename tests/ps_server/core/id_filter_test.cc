// IdFilter: never "not held" for an id added, seldom "may hold" for
// another, through its levels' growth and with a reader beside the adder.
#include "ps_server/core/id_filter.h"

#include <atomic>
#include <cstdint>
#include <thread>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

// Ids as a table meets them: hashed (spread over 64 bits) or small.
uint64_t HashedId(uint64_t i) { return i * 0x9e3779b97f4a7c15ULL + 12345; }

TEST(IdFilterTest, HoldsEveryIdAddedAcrossItsLevels) {
  IdFilter filter;
  EXPECT_FALSE(filter.MayHold(0));
  EXPECT_EQ(filter.bytes(), 0);
  // Past the first three levels' 7 levels' worth of ids.
  constexpr uint64_t kIds = 8 * IdFilter::kFirstLevelIds;
  for (uint64_t i = 0; i < kIds; ++i) filter.Add(i % 2 == 0 ? HashedId(i) : i);
  EXPECT_EQ(filter.ids_added(), static_cast<int64_t>(kIds));
  for (uint64_t i = 0; i < kIds; ++i) {
    ASSERT_TRUE(filter.MayHold(i % 2 == 0 ? HashedId(i) : i)) << "id number " << i;
  }
  // Four levels (1, 2, 4 and 8 first levels' ids) at 10 bits an id: about
  // 2.5 bytes an id.
  EXPECT_LE(filter.bytes(), static_cast<int64_t>(kIds * 5 / 2) + 64);
  EXPECT_GE(filter.bytes(), static_cast<int64_t>(kIds * 5 / 4));
}

TEST(IdFilterTest, SeldomSaysMayHoldOfAnIdNotAdded) {
  IdFilter filter;
  constexpr uint64_t kIds = 4 * IdFilter::kFirstLevelIds;  // three levels
  for (uint64_t i = 0; i < kIds; ++i) filter.Add(HashedId(i));
  int64_t false_positives = 0;
  constexpr uint64_t kOthers = 1 << 20;
  for (uint64_t i = kIds; i < kIds + kOthers; ++i) false_positives += filter.MayHold(HashedId(i));
  // About 1% a level; three levels.
  EXPECT_LT(false_positives, static_cast<int64_t>(kOthers / 20)) << false_positives;
  // Small ids (a table's ids before any hashing) as well.
  false_positives = 0;
  for (uint64_t i = 0; i < kOthers; ++i) false_positives += filter.MayHold(i);
  EXPECT_LT(false_positives, static_cast<int64_t>(kOthers / 20)) << false_positives;
}

TEST(IdFilterTest, AReaderBesideTheAdderFindsWhatWasAddedBeforeItsRead) {
  IdFilter filter;
  constexpr uint64_t kFirst = 1000;
  for (uint64_t i = 0; i < kFirst; ++i) filter.Add(HashedId(i));
  // The adder publishes how many ids it added; every id below that count
  // must be held for the reader, while levels are allocated beside it.
  std::atomic<uint64_t> added{kFirst};
  std::atomic<bool> done{false};
  std::atomic<int64_t> misses{0};
  std::thread reader([&] {
    uint64_t probe = 0;
    while (!done.load(std::memory_order_acquire)) {
      const uint64_t upto = added.load(std::memory_order_acquire);
      if (!filter.MayHold(HashedId(probe % upto))) misses.fetch_add(1);
      probe = probe * 6364136223846793005ULL + 1442695040888963407ULL;
    }
  });
  for (uint64_t i = kFirst; i < 4 * IdFilter::kFirstLevelIds; ++i) {
    filter.Add(HashedId(i));
    added.store(i + 1, std::memory_order_release);
  }
  done.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(misses.load(), 0);
}

}  // namespace PST_FILE_ID
}  // namespace pst
