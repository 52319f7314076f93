#include "psctl/table_report.h"

#include <algorithm>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

EmbeddingTableStats Table(const std::string& name, int64_t rows, int64_t refused) {
  EmbeddingTableStats table;
  table.set_table(name);
  table.set_dim(16);
  table.set_rows(rows);
  table.set_bytes(rows * 180);
  table.set_rows_admitted(rows);
  table.set_rows_refused(refused);
  return table;
}

TEST(EmbeddingTableReportTest, ShowsEachTablesShareOfEachShard) {
  std::vector<StatsResponse> shards(2);
  *shards[0].add_embeddings() = Table("user", 1000, 0);
  *shards[0].add_embeddings() = Table("item", 20, 0);
  *shards[1].add_embeddings() = Table("user", 990, 7);
  *shards[1].add_embeddings() = Table("item", 25, 0);
  const std::string report = EmbeddingTableReport(shards);
  EXPECT_THAT(report, HasSubstr("rows_admitted"));
  EXPECT_THAT(report, HasSubstr("rows_refused"));
  EXPECT_THAT(report, HasSubstr("rows_evicted"));
  EXPECT_THAT(report, ::testing::ContainsRegex("user +ps:0 +16 +1000 +180000 +1000 +0 +0\n"));
  EXPECT_THAT(report, ::testing::ContainsRegex("user +ps:1 +16 +990 +178200 +990 +7 +0\n"));
  EXPECT_THAT(report, ::testing::ContainsRegex("item +ps:1 +16 +25 +4500 +25 +0 +0\n"));
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 5);
}

TEST(EmbeddingTableReportTest, IsEmptyWithoutTables) {
  EXPECT_EQ(EmbeddingTableReport(std::vector<StatsResponse>(3)), "");
}

TEST(TableTierReportTest, ShowsTheTiersOfTablesThatHaveThem) {
  std::vector<StatsResponse> shards(2);
  *shards[0].add_embeddings() = Table("item", 20, 0);  // all in RAM: no line
  EmbeddingTableStats user = Table("user", 1000, 0);
  user.set_rows_in_memory(400);
  user.set_rows_on_disk(600);
  user.set_disk_bytes(123456);
  user.set_lookups_in_memory(750);
  user.set_disk_reads(250);
  user.set_disk_waits(30);
  user.set_rows_demoted(900);
  user.set_rows_promoted(300);
  user.set_rows_expired(4);
  *shards[1].add_embeddings() = user;
  const std::string report = TableTierReport(shards);
  EXPECT_THAT(report, HasSubstr("hit_rate"));
  EXPECT_THAT(report, HasSubstr("disk_waits"));
  EXPECT_THAT(report,
              ::testing::ContainsRegex("user +ps:1 +400 +600 +123456 +75.0% +30 +900 +300 +4\n"));
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 2);
  EXPECT_EQ(TableTierReport(std::vector<StatsResponse>(1)), "");
}

// Each shard's refusals on a line of its own, region handoffs included.
TEST(RefusalReportTest, ShowsEachShardsRefusals) {
  std::vector<StatsResponse> shards(2);
  shards[0].set_exchanges_refused(3);
  shards[0].set_sessions_refused(1);
  shards[1].set_connections_refused(5);
  shards[1].set_region_handoffs_refused(17);
  const std::string report = RefusalReport(shards);
  EXPECT_THAT(report, HasSubstr("region_handoffs"));
  EXPECT_THAT(report, ::testing::ContainsRegex("ps:0 +3 +1 +0 +0\n"));
  EXPECT_THAT(report, ::testing::ContainsRegex("ps:1 +0 +0 +5 +17\n"));
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), 3);
}

}  // namespace PST_FILE_ID
}  // namespace pst
