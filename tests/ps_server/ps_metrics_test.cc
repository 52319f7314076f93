// The shard's metrics: one Stats snapshot per scrape, which every gauge and
// counter of that scrape reads.
#include "ps_server/ps_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

TEST(ShardMetricsTest, AScrapeReadsOneStatsSnapshot) {
  metrics::Registry registry;
  int reads = 0;
  ExportShardMetrics(&registry, [&] {
    ++reads;
    // Each snapshot differs from the last, so values from two of them
    // would not agree.
    StatsResponse stats;
    stats.set_version(100 * reads);
    stats.set_pushes_applied(100 * reads);
    stats.set_live_workers(reads);
    stats.set_workers_done(2);
    stats.mutable_checkpoint()->set_version(-1);
    return stats;
  });
  std::string text = registry.Render();
  EXPECT_EQ(reads, 1);
  EXPECT_THAT(text, HasSubstr("\npst_ps_version 100\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_pushes_applied_total 100\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_live_workers 1\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_workers_done 2\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_checkpoint_version -1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE pst_ps_pushes_applied_total counter\n"));
  text = registry.Render();
  EXPECT_EQ(reads, 2);
  EXPECT_THAT(text, HasSubstr("\npst_ps_version 200\n"));
  EXPECT_THAT(text, HasSubstr("\npst_ps_live_workers 2\n"));
}

}  // namespace
}  // namespace pst
