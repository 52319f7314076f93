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

}  // namespace PST_FILE_ID
}  // namespace pst
