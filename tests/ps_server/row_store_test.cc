// RowStore: rows found by id, across blocks, their contents where they
// were put, and memory that grows a block at a time.
#include "ps_server/row_store.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace {

TEST(RowStoreTest, RowsAreFoundByIdAndHoldWhatWasPutAcrossBlocks) {
  RowStore store(/*dim=*/2, /*slots_per_value=*/2);
  EXPECT_EQ(store.size(), 0);
  EXPECT_EQ(store.Find(5), -1);
  const int64_t rows = 2 * RowStore::kRowsPerBlock + 3;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t id = static_cast<uint64_t>(r) * 1000003;
    const float v = static_cast<float>(r);
    EXPECT_EQ(store.Add(id, std::vector<float>{v, -v}, std::vector<float>{1, 2, 3, v}, r + 1), r);
  }
  EXPECT_EQ(store.size(), rows);
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(r);
    const uint64_t id = static_cast<uint64_t>(r) * 1000003;
    ASSERT_EQ(store.Find(id), r);
    EXPECT_EQ(store.id(r), id);
    const float v = static_cast<float>(r);
    EXPECT_EQ(std::vector<float>(store.values(r).begin(), store.values(r).end()),
              (std::vector<float>{v, -v}));
    EXPECT_EQ(std::vector<float>(store.slots(r).begin(), store.slots(r).end()),
              (std::vector<float>{1, 2, 3, v}));
    EXPECT_EQ(store.updates(r), r + 1);
  }
  EXPECT_EQ(store.Find(1), -1);
  store.values(7)[1] = 42;
  store.set_updates(7, 9);
  EXPECT_EQ(store.values(7)[1], 42);
  EXPECT_EQ(store.values(6)[1], -6);
  EXPECT_EQ(store.updates(7), 9);
}

TEST(RowStoreTest, MemoryGrowsABlockAtATime) {
  RowStore store(/*dim=*/4, /*slots_per_value=*/0);
  EXPECT_EQ(store.bytes(), 0);
  const int64_t block = RowStore::kRowsPerBlock * (4 * 4 + 8 + 8);
  store.Add(1, std::vector<float>(4), {}, 1);
  EXPECT_GE(store.bytes(), block);
  EXPECT_LT(store.bytes(), block + 4096);
  for (uint64_t id = 2; id <= static_cast<uint64_t>(RowStore::kRowsPerBlock); ++id) {
    store.Add(id, std::vector<float>(4), {}, 1);
  }
  const int64_t one_block = store.bytes();
  EXPECT_LT(one_block, 2 * block);
  store.Add(0, std::vector<float>(4), {}, 1);
  EXPECT_GE(store.bytes(), one_block + block);
}

}  // namespace
}  // namespace pst
