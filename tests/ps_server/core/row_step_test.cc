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

TEST(RowStepTest, RowIdReadsLittleEndianUint64) {
  const std::string ids("\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f", 16);
  EXPECT_EQ(RowId(ids, 0), 1u);
  EXPECT_EQ(RowId(ids, 1), 0x7fffffffffffffffu);
}

}  // namespace PST_FILE_ID
}  // namespace pst
