// The shard's metrics: one Stats snapshot per scrape, which every gauge and
// counter of that scrape reads, labelled with the process and, per worker
// or embedding table, with the worker or the table.
#include "ps_server/service/ps_metrics.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

TEST(ShardMetricsTest, AScrapeReadsOneStatsSnapshot) {
  metrics::Exposition exposition;
  int reads = 0;
  exposition.Add(ShardStatsMetrics({{"task", "ps:1"}, {"shard", "1"}}, [&] {
    ++reads;
    // Each snapshot differs from the last, so values from two of them
    // would not agree.
    StatsResponse stats;
    stats.set_version(100 * reads);
    stats.set_pushes_applied(100 * reads);
    stats.set_live_workers(reads);
    stats.set_workers_done(2);
    stats.mutable_checkpoint()->set_version(-1);
    stats.mutable_checkpoint()->set_capture_micros(2500);
    return stats;
  }));
  std::string text = exposition.Render();
  EXPECT_EQ(reads, 1);
  const std::string labels = "{shard=\"1\",task=\"ps:1\"}";
  EXPECT_THAT(text, HasSubstr("\npst_ps_version" + labels + " 100\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_pushes_applied_total" + labels + " 100\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_live_workers" + labels + " 1\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_workers_done" + labels + " 2\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_checkpoint_version" + labels + " -1\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_checkpoint_capture_seconds" + labels + " 0.0025\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_pushes_applied_total counter\n"));
  text = exposition.Render();
  EXPECT_EQ(reads, 2);
  EXPECT_THAT(text, HasSubstr("\npst_ps_version" + labels + " 200\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_live_workers" + labels + " 2\n"));
}

// Refused shared-memory region handoffs are a counter of their own.
TEST(ShardMetricsTest, RefusedRegionHandoffsAreCounted) {
  metrics::Exposition exposition;
  exposition.Add(ShardStatsMetrics({{"task", "ps:0"}, {"shard", "0"}}, [] {
    StatsResponse stats;
    stats.set_region_handoffs_refused(4);
    return stats;
  }));
  const std::string text = exposition.Render();
  EXPECT_THAT(text,
              HasSubstr("\npst_ps_region_handoffs_refused_total{shard=\"0\",task=\"ps:0\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_region_handoffs_refused_total counter\n"));
}

// Each worker the shard knows is a series of its own, worker="N".
TEST(ShardMetricsTest, EachWorkerIsASeriesLabelledWithIt) {
  metrics::Exposition exposition;
  exposition.Add(ShardStatsMetrics({{"task", "ps:0"}, {"shard", "0"}}, [] {
    StatsResponse stats;
    for (int w : {0, 2}) {
      WorkerStats* worker = stats.add_workers();
      worker->set_worker(w);
      worker->set_pushes(10 + w);
      worker->set_dropped(w);
      worker->set_last_staleness(3 * w);
      worker->set_live(w == 0);
    }
    return stats;
  }));
  const std::string text = exposition.Render();
  EXPECT_THAT(text, HasSubstr("\npst_ps_worker_pushes_total{shard=\"0\",task=\"ps:0\",worker=\"0\"} 10\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_worker_pushes_total{shard=\"0\",task=\"ps:0\",worker=\"2\"} 12\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_worker_pushes_dropped_total{shard=\"0\",task=\"ps:0\",worker=\"2\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_worker_staleness{shard=\"0\",task=\"ps:0\",worker=\"2\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_worker_live{shard=\"0\",task=\"ps:0\",worker=\"0\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_worker_live{shard=\"0\",task=\"ps:0\",worker=\"2\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_worker_pushes_total counter\n"));
}

// Each embedding table is a series of its own, table="NAME".
TEST(ShardMetricsTest, EachEmbeddingTableIsASeriesLabelledWithIt) {
  metrics::Exposition exposition;
  exposition.Add(ShardStatsMetrics({{"task", "ps:0"}, {"shard", "0"}}, [] {
    StatsResponse stats;
    for (const char* name : {"users", "items"}) {
      EmbeddingTableStats* table = stats.add_embeddings();
      table->set_table(name);
      table->set_rows(name[0] == 'u' ? 7 : 9);
      table->set_bytes(1024);
      table->set_rows_refused(name[0] == 'u' ? 0 : 2);
    }
    return stats;
  }));
  const std::string text = exposition.Render();
  EXPECT_THAT(text, HasSubstr("\npst_ps_table_rows{shard=\"0\",table=\"users\",task=\"ps:0\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_table_rows{shard=\"0\",table=\"items\",task=\"ps:0\"} 9\n"));
  EXPECT_THAT(text,
              HasSubstr("\npst_ps_table_rows_refused_total{shard=\"0\",table=\"items\",task=\"ps:0\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_table_bytes gauge\n"));
}

// A tiered table's tiers and moves.
TEST(ShardMetricsTest, ATablesTiersAreSeries) {
  metrics::Exposition exposition;
  exposition.Add(ShardStatsMetrics({{"task", "ps:0"}, {"shard", "0"}}, [] {
    StatsResponse stats;
    EmbeddingTableStats* table = stats.add_embeddings();
    table->set_table("users");
    table->set_rows_in_memory(4);
    table->set_rows_on_disk(30);
    table->set_disk_bytes(4096);
    table->set_lookups_in_memory(11);
    table->set_disk_reads(6);
    table->set_disk_read_hits(3);
    table->set_disk_reads_filtered(1);
    table->set_rows_prefetched(7);
    table->set_prefetch_hits(4);
    table->set_disk_waits(1);
    table->set_rows_demoted(40);
    table->set_rows_promoted(10);
    table->set_rows_expired(2);
    return stats;
  }));
  const std::string text = exposition.Render();
  const std::string labels = "{shard=\"0\",table=\"users\",task=\"ps:0\"} ";
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"pst_ps_table_rows_in_memory", "4"},
      {"pst_ps_table_rows_on_disk", "30"},
      {"pst_ps_table_disk_bytes", "4096"},
      {"pst_ps_table_lookups_in_memory_total", "11"},
      {"pst_ps_table_disk_reads_total", "6"},
      {"pst_ps_table_disk_read_hits_total", "3"},
      {"pst_ps_table_disk_reads_filtered_total", "1"},
      {"pst_ps_table_rows_prefetched_total", "7"},
      {"pst_ps_table_prefetch_hits_total", "4"},
      {"pst_ps_table_disk_waits_total", "1"},
      {"pst_ps_table_rows_demoted_total", "40"},
      {"pst_ps_table_rows_promoted_total", "10"},
      {"pst_ps_table_rows_expired_total", "2"}};
  for (const auto& [name, value] : expected) {
    SCOPED_TRACE(name);
    EXPECT_THAT(text, HasSubstr("\n" + name + labels + value + "\n"));
  }
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_table_rows_on_disk gauge\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_table_rows_demoted_total counter\n"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
