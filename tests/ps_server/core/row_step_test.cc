// RowStep: per id, the rank-ordered sum over the ranks that landed, times
// 1/N, whatever order the ranks land in; ids in a fixed order.
#include "ps_server/core/row_step.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

PushRequest PushOf(int table, const std::vector<uint64_t>& ids, const std::vector<float>& rows) {
  PushRequest push;
  EmbeddingRows* part = push.add_rows();
  part->set_table(table == 0 ? "a" : "b");
  part->mutable_ids()->resize(ids.size() * 8);
  if (!ids.empty()) std::memcpy(part->mutable_ids()->data(), ids.data(), ids.size() * 8);
  part->set_dtype(FLOAT16);  // the step decodes any wire type
  EncodeValues(rows, FLOAT16, part->mutable_data());
  return push;
}

TEST(RowStepTest, TheMeanSumsRanksInOrderOverTheRanksThatLanded) {
  const std::vector<int> dims = {1, 2};
  RowStep step(4);
  // Landed out of order; rank 2 pushes nothing of table 0, rank 3 nothing.
  const PushRequest pushes[] = {PushOf(0, {9, 4}, {1, 2}), PushOf(0, {4, 7}, {4, 8}),
                                PushOf(1, {4}, {3, 5})};
  for (int rank : {2, 1, 0}) {
    const int table = rank == 2 ? 1 : 0;
    step.Land(rank, pushes[rank], std::vector<int>{table}, dims);
  }
  EXPECT_EQ(step.landed(), 3);
  std::vector<uint64_t> ids;
  std::vector<float> rows;
  step.Mean(0, 1, &ids, &rows);
  const float third = 1.0f / 3.0f;
  EXPECT_EQ(ids, (std::vector<uint64_t>{9, 4, 7}));
  EXPECT_EQ(rows, (std::vector<float>{(0.0f + 1) * third, (0.0f + 2 + 4) * third,
                                      (0.0f + 8) * third}));
  step.Mean(1, 2, &ids, &rows);
  EXPECT_EQ(ids, std::vector<uint64_t>{4});
  EXPECT_EQ(rows, (std::vector<float>{3 * third, 5 * third}));

  step.Clear();
  EXPECT_EQ(step.landed(), 0);
  step.Mean(0, 1, &ids, &rows);
  EXPECT_TRUE(ids.empty());
  EXPECT_TRUE(rows.empty());
  step.Land(3, pushes[1], std::vector<int>{0}, dims);  // a rank's buffers are reused
  step.Mean(0, 1, &ids, &rows);
  EXPECT_EQ(ids, (std::vector<uint64_t>{4, 7}));
  EXPECT_EQ(rows, (std::vector<float>{4, 8}));
}

// Each part's rows are ids.size() values (tables of dim 1).
PushRequest PushOfParts(
    const std::vector<std::pair<std::vector<uint64_t>, std::vector<float>>>& parts) {
  PushRequest push;
  for (const auto& [ids, rows] : parts) {
    EmbeddingRows* part = push.add_rows();
    part->set_table("t");
    part->mutable_ids()->resize(ids.size() * 8);
    if (!ids.empty()) std::memcpy(part->mutable_ids()->data(), ids.data(), ids.size() * 8);
    part->set_dtype(FLOAT32);
    EncodeValues(rows, FLOAT32, part->mutable_data());
  }
  return push;
}

TEST(RowStepTest, TablesOfTheSameIdsShareTheirUnionAndOthersAreUnitedAgain) {
  const std::vector<int> dims = {1, 1, 1, 1};
  RowStep step(2);
  // Tables 0 and 1 get the same ids from each rank; table 2 the same ids
  // in another order from rank 0; table 3 none from rank 1.
  step.Land(0, PushOfParts({{{5, 3}, {1, 2}}, {{5, 3}, {10, 20}}, {{3, 5}, {7, 9}}, {{5}, {4}}}),
            std::vector<int>{0, 1, 2, 3}, dims);
  step.Land(1, PushOfParts({{{3, 8}, {4, 8}}, {{3, 8}, {40, 80}}, {{3, 8}, {1, 1}}}),
            std::vector<int>{0, 1, 2}, dims);
  std::vector<uint64_t> ids;
  std::vector<float> rows;
  std::vector<RowStep::Origin> origins;
  auto origins_are = [&](std::vector<std::pair<int, uint32_t>> expected) {
    std::vector<std::pair<int, uint32_t>> got;
    for (const RowStep::Origin& o : origins) got.emplace_back(o.rank, o.index);
    return got == expected;
  };
  const float half = 0.5f;
  for (int round = 0; round < 2; ++round) {  // each table's mean alike after any other's
    step.Mean(0, 1, &ids, &rows, &origins);
    EXPECT_EQ(ids, (std::vector<uint64_t>{5, 3, 8}));
    EXPECT_EQ(rows, (std::vector<float>{(0.0f + 1) * half, (0.0f + 2 + 4) * half, 8 * half}));
    EXPECT_TRUE(origins_are({{0, 0}, {0, 1}, {1, 1}}));
    step.Mean(1, 1, &ids, &rows, &origins);
    EXPECT_EQ(ids, (std::vector<uint64_t>{5, 3, 8}));
    EXPECT_EQ(rows, (std::vector<float>{10 * half, (0.0f + 20 + 40) * half, 80 * half}));
    EXPECT_TRUE(origins_are({{0, 0}, {0, 1}, {1, 1}}));
    step.Mean(2, 1, &ids, &rows, &origins);
    EXPECT_EQ(ids, (std::vector<uint64_t>{3, 5, 8}));
    EXPECT_EQ(rows, (std::vector<float>{(0.0f + 7 + 1) * half, 9 * half, 1 * half}));
    EXPECT_TRUE(origins_are({{0, 0}, {0, 1}, {1, 1}}));
    step.Mean(3, 1, &ids, &rows, &origins);
    EXPECT_EQ(ids, (std::vector<uint64_t>{5}));
    EXPECT_EQ(rows, (std::vector<float>{4 * half}));
    EXPECT_TRUE(origins_are({{0, 0}}));
  }
}

TEST(RowStepTest, RowIdReadsLittleEndianUint64) {
  const std::string ids("\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f", 16);
  EXPECT_EQ(RowId(ids, 0), 1u);
  EXPECT_EQ(RowId(ids, 1), 0x7fffffffffffffffu);
}

}  // namespace PST_FILE_ID
}  // namespace pst
