// The initial rows: the documented formula (ps_server/core/embedding_init.h),
// recomputed here from its description, for many seeds, tables and ids.
#include "ps_server/core/embedding_init.h"

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "placement/row_placement.h"

namespace pst {
namespace PST_FILE_ID {

float Documented(uint64_t seed, const std::string& table, uint64_t id, uint64_t element,
                 float scale) {
  uint64_t name_hash = 0xcbf29ce484222325ULL;  // FNV-1a 64
  for (unsigned char c : table) name_hash = (name_hash ^ c) * 0x100000001b3ULL;
  const uint64_t key = RowHash(seed ^ name_hash);
  const uint64_t h = RowHash(RowHash(key ^ id) ^ element);
  const float u = static_cast<float>(h >> 40) / 16777216.0f;
  return scale * (2.0f * u - 1.0f);
}

TEST(EmbeddingInitTest, RowsFollowTheDocumentedFormula) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    for (const std::string table : {"", "user", "item_category"}) {
      for (uint64_t id : {uint64_t{0}, uint64_t{42}, uint64_t{1} << 63}) {
        SCOPED_TRACE(testing::Message() << seed << " " << table << " " << id);
        std::vector<float> row(9);
        InitialRow(TableInitKey(seed, table), id, 0.05f, row);
        for (size_t e = 0; e < row.size(); ++e) {
          EXPECT_EQ(row[e], Documented(seed, table, id, e, 0.05f)) << "element " << e;
        }
      }
    }
  }
}

TEST(EmbeddingInitTest, ScaleZeroGivesPositiveZeros) {
  std::vector<float> row(16, 1.0f);
  InitialRow(TableInitKey(3, "w"), 99, 0.0f, row);
  for (float v : row) EXPECT_EQ(std::bit_cast<uint32_t>(v), 0u);
}

// A table of parts starts each part's columns as the part's own table
// starts its rows; a table without parts is its own one part.
TEST(EmbeddingInitTest, EachPartStartsAsItsOwnTable) {
  EmbeddingTableConfig joint;
  joint.set_name("deep+wide");
  joint.set_dim(4);
  joint.set_init_scale(9.0f);  // unused where there are parts
  EmbeddingTablePart* deep = joint.add_parts();
  deep->set_name("deep");
  deep->set_dim(3);
  deep->set_init_scale(0.05f);
  EmbeddingTablePart* wide = joint.add_parts();
  wide->set_name("wide");
  wide->set_dim(1);
  wide->set_init_scale(0.5f);
  const TableInit init(7, joint);
  EXPECT_EQ(init.key(), TableInitKey(7, "deep+wide"));
  for (uint64_t id : {uint64_t{0}, uint64_t{42}, uint64_t{1} << 63}) {
    std::vector<float> row(4);
    init.Row(id, row);
    std::vector<float> apart(4);
    InitialRow(TableInitKey(7, "deep"), id, 0.05f, std::span<float>(apart).first(3));
    InitialRow(TableInitKey(7, "wide"), id, 0.5f, std::span<float>(apart).last(1));
    EXPECT_EQ(row, apart) << id;
  }
  EmbeddingTableConfig single;
  single.set_name("user");
  single.set_dim(5);
  single.set_init_scale(0.1f);
  std::vector<float> row(5);
  std::vector<float> expected(5);
  TableInit(7, single).Row(42, row);
  InitialRow(TableInitKey(7, "user"), 42, 0.1f, expected);
  EXPECT_EQ(row, expected);
}

}  // namespace PST_FILE_ID
}  // namespace pst
