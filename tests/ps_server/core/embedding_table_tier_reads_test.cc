// A tiered embedding table's reads of cold rows: read ahead of the calls
// that need them, answered by the disk tier's id filter for ids it never
// stored, and counted (hits, waits, filtered) in its stats.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps_server/core/embedding_table.h"
#include "tests/ps_server/core/embedding_table_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace embedding_testing;  // NOLINT(build/namespaces)

// SYNC steps of two ranks over ids 0-39 (each drawn with chance 1/6), each
// rank's exchange also pulling its next step's rows: handed to Prefetch
// before the step's pushes land, and answered after its commit. Returns
// every answer's bytes.
std::vector<std::string> SyncStepsWithPulls(EmbeddingTable& table, int steps) {
  std::mt19937_64 draw(5);
  std::vector<std::vector<std::vector<uint64_t>>> parts(steps + 1);
  for (auto& step : parts) {
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<uint64_t>& part = step.emplace_back();
      for (uint64_t id = 0; id < 40; ++id) {
        if (draw() % 6 == 0) part.push_back(id);
      }
    }
  }
  std::vector<std::string> answers;
  for (int step = 0; step < steps; ++step) {
    std::vector<PullRequest> pulls(2);
    for (int rank = 0; rank < 2; ++rank) {
      pulls[rank].set_worker(rank);
      *pulls[rank].add_rows() = Rows("t", parts[step + 1][rank], {});
      table.Prefetch(pulls[rank]);
    }
    for (int rank = 0; rank < 2; ++rank) {
      const std::vector<uint64_t>& part = parts[step][rank];
      const PushRequest push = Push({Rows("t", part, Gradients(part, 4, step + rank))}, rank);
      TablePush plan;
      EXPECT_TRUE(table.CheckPush(push, true, true, &plan).ok());
      table.Land(rank, push, plan);
    }
    EXPECT_TRUE(table.StageStep({}).ok());
    table.Commit();
    for (const PullRequest& pull : pulls) {
      PullResponse answer;
      EXPECT_TRUE(table.AnswerPull(pull, &answer).ok());
      answers.push_back(answer.rows(0).data());
    }
  }
  return answers;
}

TEST(EmbeddingTiersTest, RowsReadAheadTrainAndAnswerBitwiseAsRam) {
  for (int64_t prefetch_rows :
       {int64_t{0}, int64_t{3}, EmbeddingTableOptions::kDefaultPrefetchRows}) {
    SCOPED_TRACE(prefetch_rows);
    const std::string dir = FreshDir("tiers_ahead");
    EmbeddingTableOptions options = Options(0, 1, 2);
    options.prefetch_rows = prefetch_rows;
    std::unique_ptr<EmbeddingTable> tiered =
        Make({Tiered(Spec("t", 4, Adam(0.01f)), 4, dir, 2)}, options);
    std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 4, Adam(0.01f))}, Options(0, 1, 2));
    EXPECT_EQ(SyncStepsWithPulls(*tiered, 100), SyncStepsWithPulls(*ram, 100));
    EXPECT_EQ(RowsOf(*tiered), RowsOf(*ram));
    const EmbeddingTableStats stats = StatsOf(*tiered, "t");
    EXPECT_GT(stats.rows_promoted(), 100 * 4);
    // Every read that missed RAM was of an id the disk tier never stored,
    // or read ahead in time, or waited.
    EXPECT_EQ(stats.disk_reads_filtered() + stats.prefetch_hits() + stats.disk_waits(),
              stats.disk_reads());
    EXPECT_GT(stats.disk_reads_filtered(), 0);
    if (prefetch_rows == 0) {
      EXPECT_EQ(stats.rows_prefetched(), 0);
      EXPECT_EQ(stats.prefetch_hits(), 0);
    } else {
      // A pull's answer waits for the rows still being read; the update
      // after it then takes them read. With room for 3 rows, most are
      // read in the calls.
      EXPECT_GT(stats.rows_prefetched(), 100);
      EXPECT_GT(stats.prefetch_hits(), 100);
      if (prefetch_rows == 3) {
        EXPECT_GT(stats.disk_waits(), stats.prefetch_hits());
      }
    }
  }
}

TEST(EmbeddingTiersTest, StatsCountReadsMovesAndTiers) {
  const std::string dir = FreshDir("tiers_stats");
  std::unique_ptr<EmbeddingTable> table = Make({Tiered(Spec("t", 2, Sgd(0.1f)), 2, dir, 0)});
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {1, 2}, {1, 1, 1, 1})})).ok());  // 2 new
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {3}, {1, 1})})).ok());           // demotes one
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {1, 2}, {1, 1, 1, 1})})).ok());  // promotes one
  Lookup(*table, "t", {1, 2, 3, 99});
  const EmbeddingTableStats s = StatsOf(*table, "t");
  EXPECT_EQ(s.rows(), 3);
  EXPECT_EQ(s.rows_in_memory(), 2);
  EXPECT_EQ(s.rows_on_disk(), 1);
  EXPECT_EQ(s.rows_admitted(), 3);
  EXPECT_EQ(s.rows_demoted(), 2);  // one for id 3, one for the promoted row
  EXPECT_EQ(s.rows_promoted(), 1);
  // Reads: updates 2 + 1 + 2, the lookup 4; disk: the update's misses
  // (1, 2, 3; one promoted) and the lookup's two (3 on disk, 99 nowhere).
  EXPECT_EQ(s.lookups_in_memory() + s.disk_reads(), 9);
  EXPECT_EQ(s.disk_reads(), 6);
  EXPECT_EQ(s.disk_read_hits(), 2);
  // The new ids' reads (1, 2, 3 in the first two updates, and 99) were
  // answered by the disk tier's id filter; nothing was read ahead, so the
  // two reads of rows the tier held waited.
  EXPECT_EQ(s.disk_reads_filtered(), 4);
  EXPECT_EQ(s.disk_waits(), 2);
  EXPECT_EQ(s.prefetch_hits(), 0);
}

}  // namespace PST_FILE_ID
}  // namespace pst
