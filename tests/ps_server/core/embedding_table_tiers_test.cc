// An embedding table over a disk tier: demotion replaces eviction, an
// update promotes the rows it trains, and the table trains, checkpoints
// and restores bitwise as the same table all in RAM; TTL expiry, a full
// disk, the memory rule and the storage config's checks (its reads ahead
// and their counters: embedding_table_tier_reads_test.cc).
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/config.h"
#include "common/embedding_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/shard_snapshot.h"
#include "tests/ps_server/core/embedding_table_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace embedding_testing;  // NOLINT(build/namespaces)

std::vector<uint64_t> Range(uint64_t n) {
  std::vector<uint64_t> ids(n);
  for (uint64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

struct Optimizers {
  const char* name;
  OptimizerConfig config;
  int slots_per_value;
};

const Optimizers kRules[] = {{"sgd", Sgd(0.1f), 0},
                             {"adagrad", Adagrad(0.1f, 0.1f), 1},
                             {"adam", Adam(0.01f), 2}};

TEST(EmbeddingTiersTest, TheMemoryBudgetBecomesARowLimit) {
  const std::string dir = FreshDir("tiers_rule");
  for (const Optimizers& rule : kRules) {
    SCOPED_TRACE(rule.name);
    EmbeddingTableConfig spec = Spec("t", 8, rule.config, 1000);
    spec.mutable_storage()->set_memory_bytes(10 * RowBytes(8, rule.slots_per_value));
    EXPECT_EQ(Make({spec})->row_limit("t"), 10);
    spec.mutable_storage()->set_memory_bytes(10 * RowBytes(8, rule.slots_per_value) - 1);
    EXPECT_EQ(Make({spec})->row_limit("t"), 9);
    spec.mutable_storage()->set_memory_bytes(1);  // at least one row
    EXPECT_EQ(Make({spec})->row_limit("t"), 1);
    spec.mutable_storage()->set_memory_bytes(int64_t{1} << 40);  // at most max_rows_per_shard
    EXPECT_EQ(Make({spec})->row_limit("t"), 1000);
  }
}

TEST(EmbeddingTiersTest, ADemotedRowIsPulledBitForBit) {
  const std::string dir = FreshDir("tiers_pull");
  std::unique_ptr<EmbeddingTable> tiered =
      Make({Tiered(Spec("t", 3, Sgd(0.1f), 0, 0.5f), 4, dir, 0)});
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 3, Sgd(0.1f), 0, 0.5f)});
  const std::vector<uint64_t> ids = Range(20);
  for (int step = 0; step < 5; ++step) {
    const std::vector<uint64_t> part(ids.begin() + 4 * step, ids.begin() + 4 * step + 4);
    for (EmbeddingTable* table : {tiered.get(), ram.get()}) {
      ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 3, step))})).ok());
    }
  }
  const EmbeddingTableStats stats = StatsOf(*tiered, "t");
  EXPECT_EQ(stats.rows_in_memory(), 4);
  EXPECT_EQ(stats.rows_on_disk(), 16);
  EXPECT_EQ(stats.rows(), 20);
  EXPECT_EQ(stats.rows_demoted(), 16);
  EXPECT_EQ(stats.rows_evicted(), 0);
  EXPECT_GT(stats.disk_bytes(), 0);
  // Every row, most from disk, and ids never trained, bit for bit.
  std::vector<uint64_t> asked = Range(24);
  EXPECT_EQ(Lookup(*tiered, "t", asked), Lookup(*ram, "t", asked));
  PullRequest pull;
  pull.set_dtype(FLOAT32);
  *pull.add_rows() = Rows("t", asked, {});
  PullResponse from_tiers, from_ram;
  ASSERT_TRUE(tiered->AnswerPull(pull, &from_tiers).ok());
  ASSERT_TRUE(ram->AnswerPull(pull, &from_ram).ok());
  EXPECT_EQ(from_tiers.rows(0).data(), from_ram.rows(0).data());
  EXPECT_EQ(RowsOf(*tiered), RowsOf(*ram));
  EXPECT_EQ(tiered->ColdIds("t", asked).size(), 20u);
}

TEST(EmbeddingTiersTest, AnUpdatePromotesItsRowsWithTheirOptimizerState) {
  for (const Optimizers& rule : kRules) {
    SCOPED_TRACE(rule.name);
    const std::string dir = FreshDir(std::string("tiers_promote_") + rule.name);
    std::unique_ptr<EmbeddingTable> tiered =
        Make({Tiered(Spec("t", 4, rule.config), 3, dir, rule.slots_per_value)});
    std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 4, rule.config)});
    std::mt19937_64 draw(11);
    for (int step = 0; step < 60; ++step) {
      std::vector<uint64_t> part;
      for (uint64_t id = 0; id < 16; ++id) {
        if (draw() % 4 == 0) part.push_back(id);
      }
      for (EmbeddingTable* table : {tiered.get(), ram.get()}) {
        ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 4, step))})).ok());
      }
    }
    const EmbeddingTableStats stats = StatsOf(*tiered, "t");
    EXPECT_GT(stats.rows_promoted(), 20);
    EXPECT_GT(stats.rows_demoted(), 20);
    EXPECT_EQ(stats.rows(), StatsOf(*ram, "t").rows());
    // Values, Adagrad's accumulators, Adam's moments and update counts.
    EXPECT_EQ(RowsOf(*tiered), RowsOf(*ram));
    EXPECT_EQ(Lookup(*tiered, "t", Range(16)), Lookup(*ram, "t", Range(16)));
  }
}

// Two ranks' SYNC steps, each through Land, StageStep and Commit.
void SyncSteps(EmbeddingTable& table, int steps) {
  std::mt19937_64 draw(5);
  for (int step = 0; step < steps; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<uint64_t> part;
      for (uint64_t id = 0; id < 40; ++id) {
        if (draw() % 6 == 0) part.push_back(id);
      }
      const PushRequest push = Push({Rows("t", part, Gradients(part, 4, step + rank))}, rank);
      TablePush plan;
      ASSERT_TRUE(table.CheckPush(push, true, true, &plan).ok());
      table.Land(rank, push, plan);
    }
    ASSERT_TRUE(table.StageStep({}).ok());
    table.Commit();
  }
}

TEST(EmbeddingTiersTest, SyncStepsOverFourRowsOfRamAreBitwiseTheTableAllInRam) {
  const std::string dir = FreshDir("tiers_sync");
  std::unique_ptr<EmbeddingTable> tiered =
      Make({Tiered(Spec("t", 4, Adam(0.01f)), 4, dir, 2)}, Options(0, 1, 2));
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 4, Adam(0.01f))}, Options(0, 1, 2));
  SyncSteps(*tiered, 200);
  SyncSteps(*ram, 200);
  const EmbeddingTableStats stats = StatsOf(*tiered, "t");
  // Each step trains more rows than RAM holds: each reads most from disk.
  EXPECT_GT(stats.disk_read_hits(), 200 * 4);
  EXPECT_GT(stats.rows_promoted(), 200 * 4);
  EXPECT_EQ(stats.rows_refused(), 0);
  EXPECT_EQ(stats.rows(), 40);
  EXPECT_EQ(RowsOf(*tiered), RowsOf(*ram));
  EXPECT_EQ(Lookup(*tiered, "t", Range(40)), Lookup(*ram, "t", Range(40)));
}

TEST(EmbeddingTiersTest, RowsUntouchedForTtlUpdatesExpireFromBothTiers) {
  const std::string dir = FreshDir("tiers_ttl");
  // ttl 4: a sweep at every update (period max(1, 4 / 8)).
  std::unique_ptr<EmbeddingTable> table =
      Make({Tiered(Spec("t", 2, Sgd(0.1f), 0, 0.5f), 1, dir, 0, /*ttl=*/4)});
  std::unique_ptr<EmbeddingTable> fresh = Make({Spec("t", 2, Sgd(0.1f), 0, 0.5f)});
  // Update 1 trains ids 1 and 2 (RAM holds an update's own rows, though
  // its limit is one); update 2 trains id 3 and sends both to disk.
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {1, 2}, {1, 1, 1, 1})})).ok());
  for (int update = 2; update <= 5; ++update) {
    ASSERT_TRUE(Apply(*table, Push({Rows("t", {3}, {1, 1})})).ok());
  }
  // At the start of update 5, ids 1 and 2 have been untouched for 3
  // updates: kept.
  EXPECT_EQ(StatsOf(*table, "t").rows_expired(), 0);
  EXPECT_EQ(StatsOf(*table, "t").rows(), 3);
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {3}, {1, 1})})).ok());  // update 6: 4 untouched
  const EmbeddingTableStats stats = StatsOf(*table, "t");
  EXPECT_EQ(stats.rows_expired(), 2);
  EXPECT_EQ(stats.rows(), 1);
  EXPECT_EQ(stats.rows_on_disk(), 0);
  EXPECT_EQ(Lookup(*table, "t", {1, 2}), Lookup(*fresh, "t", {1, 2}));  // initial again
}

// A promoted row's disk copy stays until the row goes down again: the
// counts, a checkpoint and expiry see each row once, as RAM holds it.
TEST(EmbeddingTiersTest, APromotedRowsDiskCopyIsNeverTakenForTheRow) {
  const std::string dir = FreshDir("tiers_copies");
  std::unique_ptr<EmbeddingTable> tiered =
      Make({Tiered(Spec("t", 2, Adagrad(0.1f, 0.1f)), 2, dir, 1, /*ttl=*/4)});
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 2, Adagrad(0.1f, 0.1f))});
  std::unique_ptr<EmbeddingTable> fresh = Make({Spec("t", 2, Adagrad(0.1f, 0.1f))});
  auto train = [&](const std::vector<uint64_t>& ids, int update) {
    for (EmbeddingTable* table : {tiered.get(), ram.get()}) {
      ASSERT_TRUE(Apply(*table, Push({Rows("t", ids, Gradients(ids, 2, update))})).ok());
    }
  };
  train({1, 2}, 1);
  train({3, 4}, 2);  // 1 and 2 go down
  train({1, 2}, 3);  // and come up, their disk copies kept; 3 and 4 go down
  EmbeddingTableStats stats = StatsOf(*tiered, "t");
  EXPECT_EQ(stats.rows_promoted(), 2);
  EXPECT_EQ(stats.rows_in_memory(), 2);
  EXPECT_EQ(stats.rows_on_disk(), 2);
  EXPECT_EQ(stats.rows(), 4);
  // The checkpoint holds each row once, RAM's where both tiers have it.
  EXPECT_EQ(RowsOf(Exported(*tiered).embeddings(0)), RowsOf(*ram));
  ShardSnapshot snapshot;
  tiered->Capture(&snapshot);
  EXPECT_EQ(RowsOf(std::move(snapshot).Finish().embeddings(0)), RowsOf(*ram));
  EXPECT_EQ(Lookup(*tiered, "t", Range(5)), Lookup(*ram, "t", Range(5)));

  // Expiry (ttl 4, a sweep each update): 3 and 4 (last trained at update
  // 2) at update 7, 2 (at 3) at update 8, with its disk copy, though the
  // copy's own tick is older; 1 stays.
  for (int update = 4; update <= 6; ++update) train({1}, update);
  EXPECT_EQ(StatsOf(*tiered, "t").rows_expired(), 0);
  train({1}, 7);
  EXPECT_EQ(StatsOf(*tiered, "t").rows_expired(), 2);
  train({1}, 8);
  stats = StatsOf(*tiered, "t");
  EXPECT_EQ(stats.rows_expired(), 3);
  EXPECT_EQ(stats.rows(), 1);
  EXPECT_EQ(stats.rows_on_disk(), 0);
  EXPECT_EQ(Lookup(*tiered, "t", {2, 3, 4}), Lookup(*fresh, "t", {2, 3, 4}));
  EXPECT_EQ(Lookup(*tiered, "t", {1}), Lookup(*ram, "t", {1}));
  EXPECT_EQ(RowsOf(Exported(*tiered).embeddings(0)).size(), 1u);
}

// Skewed ids (a few often, most rarely): LFU keeps the often-updated rows
// in RAM where LRU lets one-off rows push them out; both train bitwise as
// the table all in RAM.
TEST(EmbeddingTiersTest, LeastFrequentlyUsedKeepsSkewedReadsInRamMoreOften) {
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 2, Adagrad(0.1f, 0.1f))});
  EmbeddingTableStats stats[2];
  for (int lfu = 0; lfu < 2; ++lfu) {
    const std::string dir = FreshDir(lfu ? "tiers_lfu" : "tiers_lru");
    EmbeddingTableConfig spec = Tiered(Spec("t", 2, Adagrad(0.1f, 0.1f)), 16, dir, 1);
    if (lfu) spec.mutable_storage()->set_hot_set(TableStorage::LEAST_FREQUENTLY_USED);
    std::unique_ptr<EmbeddingTable> table = Make({spec});
    std::mt19937_64 draw(3);
    for (int step = 0; step < 300; ++step) {
      std::vector<uint64_t> part;
      for (int i = 0; i < 6; ++i) {
        const double u = double(draw() % 1000000) / 1e6;
        const auto id = static_cast<uint64_t>(u * u * u * u * 400);  // skewed toward 0
        if (std::find(part.begin(), part.end(), id) == part.end()) part.push_back(id);
      }
      ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 2, step))})).ok());
      if (lfu) {
        ASSERT_TRUE(Apply(*ram, Push({Rows("t", part, Gradients(part, 2, step))})).ok());
      }
    }
    stats[lfu] = StatsOf(*table, "t");
    if (lfu) {
      EXPECT_EQ(RowsOf(*table), RowsOf(*ram));
    }
  }
  EXPECT_EQ(stats[0].lookups_in_memory() + stats[0].disk_reads(),
            stats[1].lookups_in_memory() + stats[1].disk_reads());
  EXPECT_LT(stats[1].disk_read_hits(), stats[0].disk_read_hits() * 9 / 10)
      << "LFU " << stats[1].disk_read_hits() << " disk reads of rows, LRU "
      << stats[0].disk_read_hits();
}

// Under LFU a new row, the least frequent of all, goes to disk once RAM is
// full instead of sending another row down, and comes up when an update
// reads it again; where its disk write fails, it stays in RAM past the
// limit, which the next update restores. Under LRU it takes a row's place.
TEST(EmbeddingTiersTest, UnderLfuANewRowGoesToDiskOnceRamIsFull) {
  const std::string dir = FreshDir("tiers_new_rows");
  EmbeddingTableOptions options = Options();
  options.disk_fail_writes = std::make_shared<std::atomic<bool>>(false);
  EmbeddingTableConfig spec = Tiered(Spec("t", 2, Adagrad(0.1f, 0.1f)), 2, dir, 1);
  spec.mutable_storage()->set_hot_set(TableStorage::LEAST_FREQUENTLY_USED);
  std::unique_ptr<EmbeddingTable> table = Make({spec}, options);
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 2, Adagrad(0.1f, 0.1f))});
  int step = 0;
  auto train = [&](const std::vector<uint64_t>& ids) {
    for (EmbeddingTable* t : {table.get(), ram.get()}) {
      ASSERT_TRUE(Apply(*t, Push({Rows("t", ids, Gradients(ids, 2, step))})).ok());
    }
    ++step;
  };
  const std::vector<uint64_t> three = {3}, seven = {7}, trained = {1, 2, 3};
  train({1, 2});
  train({1, 2});
  train(three);
  EmbeddingTableStats stats = StatsOf(*table, "t");
  EXPECT_EQ(stats.rows_in_memory(), 2);
  EXPECT_EQ(stats.rows_on_disk(), 1);
  EXPECT_EQ(stats.rows_demoted(), 0);
  EXPECT_EQ(table->ColdIds("t", trained), three);
  EXPECT_EQ(RowsOf(*table), RowsOf(*ram));

  train(three);  // read again: up, and one of 1 and 2 down
  stats = StatsOf(*table, "t");
  EXPECT_EQ(stats.rows_in_memory(), 2);
  EXPECT_EQ(stats.rows_demoted(), 1);
  EXPECT_EQ(stats.rows_promoted(), 1);
  EXPECT_TRUE(table->ColdIds("t", three).empty());
  EXPECT_EQ(RowsOf(*table), RowsOf(*ram));

  options.disk_fail_writes->store(true);
  train(seven);  // a commit cannot fail: RAM keeps the row past its limit
  EXPECT_EQ(StatsOf(*table, "t").rows_in_memory(), 3);
  EXPECT_TRUE(table->ColdIds("t", seven).empty());
  EXPECT_EQ(RowsOf(*table), RowsOf(*ram));
  options.disk_fail_writes->store(false);
  train(seven);
  EXPECT_EQ(StatsOf(*table, "t").rows_in_memory(), 2);
  EXPECT_EQ(RowsOf(*table), RowsOf(*ram));
  EXPECT_EQ(Lookup(*table, "t", Range(8)), Lookup(*ram, "t", Range(8)));

  // Under LRU the new row stays, and a row goes down for it.
  const std::string lru_dir = FreshDir("tiers_new_rows_lru");
  std::unique_ptr<EmbeddingTable> lru =
      Make({Tiered(Spec("t", 2, Adagrad(0.1f, 0.1f)), 2, lru_dir, 1)});
  for (const std::vector<uint64_t>& ids : {std::vector<uint64_t>{1, 2}, {3}}) {
    ASSERT_TRUE(Apply(*lru, Push({Rows("t", ids, Gradients(ids, 2, 0))})).ok());
  }
  EXPECT_EQ(StatsOf(*lru, "t").rows_demoted(), 1);
  EXPECT_TRUE(lru->ColdIds("t", three).empty());
}

TEST(EmbeddingTiersTest, ACheckpointHoldsBothTiersAndRestoresIntoTiersOrRam) {
  const std::string dir = FreshDir("tiers_checkpoint");
  const EmbeddingTableConfig spec = Tiered(Spec("t", 4, Adagrad(0.1f, 0.1f)), 3, dir, 1);
  std::unique_ptr<EmbeddingTable> tiered = Make({spec});
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 4, Adagrad(0.1f, 0.1f))});
  for (int step = 0; step < 6; ++step) {
    const std::vector<uint64_t> part = {uint64_t(2 * step), uint64_t(2 * step + 1), 100};
    for (EmbeddingTable* table : {tiered.get(), ram.get()}) {
      ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 4, step))})).ok());
    }
  }
  ASSERT_GT(StatsOf(*tiered, "t").rows_on_disk(), 0);
  const ShardCheckpoint checkpoint = Exported(*tiered);
  ASSERT_EQ(RowsOf(checkpoint.embeddings(0)), RowsOf(*ram));
  tiered.reset();  // its tier's directory is the restored table's

  // Into a tiered table (its tier emptied first): RAM takes the row limit.
  std::unique_ptr<EmbeddingTable> again = Make({});
  ASSERT_TRUE(again->Restore(checkpoint).ok());
  EXPECT_EQ(StatsOf(*again, "t").rows_in_memory(), 3);
  EXPECT_EQ(StatsOf(*again, "t").rows_on_disk(), 10);
  EXPECT_EQ(RowsOf(*again), RowsOf(*ram));
  EXPECT_EQ(Lookup(*again, "t", Range(14)), Lookup(*ram, "t", Range(14)));

  // Into RAM alone: the same checkpoint without its storage.
  ShardCheckpoint in_ram = checkpoint;
  in_ram.mutable_embeddings(0)->mutable_config()->clear_storage();
  std::unique_ptr<EmbeddingTable> all = Make({});
  ASSERT_TRUE(all->Restore(in_ram).ok());
  EXPECT_EQ(StatsOf(*all, "t").rows_in_memory(), 13);
  EXPECT_EQ(RowsOf(*all), RowsOf(*ram));

  // Both go on training as the table all in RAM.
  const std::vector<uint64_t> part = {1, 5, 9, 13};
  for (EmbeddingTable* table : {again.get(), all.get(), ram.get()}) {
    ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 4, 9))})).ok());
  }
  EXPECT_EQ(RowsOf(*again), RowsOf(*ram));
  EXPECT_EQ(RowsOf(*all), RowsOf(*ram));
}

TEST(EmbeddingTiersTest, AnIncompleteCheckpointIsNotRestored) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("t", 2)});
  ShardCheckpoint checkpoint = Exported(*table);
  checkpoint.set_incomplete("embedding table \"t\": the rows of its disk tier cannot be read");
  std::unique_ptr<EmbeddingTable> restored = Make({});
  const absl::Status s = restored->Restore(checkpoint);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the checkpoint is incomplete: embedding table \"t\""));
}

TEST(EmbeddingTiersTest, ACaptureIsTheTableAtItsTimeWhateverMovesAfter) {
  const std::string dir = FreshDir("tiers_capture");
  std::unique_ptr<EmbeddingTable> table = Make({Tiered(Spec("t", 2, Adam(0.01f)), 2, dir, 2)});
  for (int step = 0; step < 4; ++step) {
    const std::vector<uint64_t> part = {uint64_t(2 * step), uint64_t(2 * step + 1)};
    ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 2, step))})).ok());
  }
  const RowMap then = RowsOf(*table);
  ShardSnapshot snapshot;
  table->Capture(&snapshot);
  // Promotions, demotions and new rows after the capture.
  for (int step = 0; step < 4; ++step) {
    const std::vector<uint64_t> part = {uint64_t(step), uint64_t(7 - step), uint64_t(20 + step)};
    ASSERT_TRUE(Apply(*table, Push({Rows("t", part, Gradients(part, 2, step))})).ok());
  }
  ASSERT_NE(RowsOf(*table), then);
  const ShardCheckpoint captured = std::move(snapshot).Finish();
  EXPECT_EQ(RowsOf(captured.embeddings(0)), then);
}

TEST(EmbeddingTiersTest, AFullDiskFailsTheUpdateAndLosesNothing) {
  const std::string dir = FreshDir("tiers_full");
  EmbeddingTableOptions options = Options();
  options.disk_fail_writes = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<EmbeddingTable> table =
      Make({Tiered(Spec("t", 2, Adagrad(0.1f, 0.1f), 0, 0.5f), 2, dir, 1)}, options);
  std::unique_ptr<EmbeddingTable> ram = Make({Spec("t", 2, Adagrad(0.1f, 0.1f), 0, 0.5f)});
  for (const std::vector<uint64_t>& first : {std::vector<uint64_t>{1, 2}, {3, 4}}) {
    for (EmbeddingTable* t : {table.get(), ram.get()}) {
      ASSERT_TRUE(Apply(*t, Push({Rows("t", first, Gradients(first, 2, 0))})).ok());
    }
  }
  ASSERT_EQ(StatsOf(*table, "t").rows_on_disk(), 2);
  const RowMap before = RowsOf(*table);
  const EmbeddingTableStats stats_before = StatsOf(*table, "t");

  options.disk_fail_writes->store(true);
  const std::vector<uint64_t> next = {5, 6};  // needs two demotions
  const absl::Status s = Apply(*table, Push({Rows("t", next, Gradients(next, 2, 1))}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("embedding table \"t\" shard 0"));
  EXPECT_THAT(s.message(), HasSubstr(dir + "/t-shard0"));
  // Nothing moved, nothing lost; pulls go on.
  EXPECT_EQ(RowsOf(*table), before);
  EXPECT_EQ(StatsOf(*table, "t").rows_in_memory(), stats_before.rows_in_memory());
  EXPECT_EQ(StatsOf(*table, "t").rows_demoted(), stats_before.rows_demoted());
  EXPECT_EQ(Lookup(*table, "t", Range(8)), Lookup(*ram, "t", Range(8)));
  // An update that needs no disk write still applies.
  const std::vector<uint64_t> hot = {3, 4};
  ASSERT_EQ(StatsOf(*table, "t").rows_in_memory(), 2);
  ASSERT_TRUE(table->ColdIds("t", hot).empty());
  for (EmbeddingTable* t : {table.get(), ram.get()}) {
    ASSERT_TRUE(Apply(*t, Push({Rows("t", hot, Gradients(hot, 2, 2))})).ok());
  }

  options.disk_fail_writes->store(false);  // room again
  for (EmbeddingTable* t : {table.get(), ram.get()}) {
    ASSERT_TRUE(Apply(*t, Push({Rows("t", next, Gradients(next, 2, 1))})).ok());
  }
  EXPECT_EQ(RowsOf(*table), RowsOf(*ram));
}

TEST(EmbeddingTiersTest, AnotherInitAfterARefusedOneOpensTheTierAgain) {
  const std::string dir = FreshDir("tiers_init_again");
  EmbeddingTable table(Options());
  InitRequest init;
  *init.add_embeddings() = Tiered(Spec("t", 2, Sgd(0.1f)), 2, dir, 0);
  ASSERT_TRUE(table.Initialize(init).ok());
  // The shard calls Initialize again when a later table refused the Init.
  ASSERT_TRUE(table.Initialize(init).ok());
  ASSERT_TRUE(Apply(table, Push({Rows("t", {1, 2, 3}, {1, 1, 1, 1, 1, 1})})).ok());
  ASSERT_TRUE(Apply(table, Push({Rows("t", {4}, {1, 1})})).ok());  // two go down
  EXPECT_EQ(StatsOf(table, "t").rows_on_disk(), 2);
}

TEST(EmbeddingTiersTest, TheStorageConfigIsChecked) {
  EmbeddingTableConfig spec = Spec("t", 2);
  spec.mutable_storage()->set_memory_bytes(-1);
  EXPECT_THAT(ResolveEmbeddingTable(spec, Sgd(0.1f)).status().message(),
              HasSubstr("storage.memory_bytes must be >= 0"));
  spec = Spec("t", 2);
  spec.mutable_storage()->set_ttl_steps(-3);
  EXPECT_THAT(ResolveEmbeddingTable(spec, Sgd(0.1f)).status().message(),
              HasSubstr("storage.ttl_steps must be >= 0"));
  spec = Spec("t", 2);
  spec.mutable_storage()->set_hot_set(static_cast<TableStorage::HotSet>(7));
  EXPECT_THAT(ResolveEmbeddingTable(spec, Sgd(0.1f)).status().message(),
              HasSubstr("storage.hot_set 7 is not"));
  spec = Refusing(Spec("t", 2));
  spec.mutable_storage()->set_disk("/tmp");
  EXPECT_THAT(ResolveEmbeddingTable(spec, Sgd(0.1f)).status().message(),
              HasSubstr("REFUSE_NEW_ROWS contradicts storage.disk"));

  const std::string file = FreshDir("tiers_not_a_dir");
  std::ofstream(file) << "a file";
  JobConfig config;
  EmbeddingTableConfig* table = config.mutable_training()->mutable_model()->add_embeddings();
  *table = Spec("t", 2);
  table->mutable_storage()->set_disk(file + "/tiers");
  const absl::Status s = CheckEmbeddingDisks(config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("training.model.embeddings[0].storage.disk"));
  EXPECT_THAT(s.message(), HasSubstr("choose a directory this process can write"));
  const std::string writable = FreshDir("tiers_writable") + "/made";
  table->mutable_storage()->set_disk(writable);
  EXPECT_TRUE(CheckEmbeddingDisks(config).ok());
  EXPECT_FALSE(std::filesystem::exists(writable));  // --check_config makes nothing
  EXPECT_TRUE(CheckEmbeddingDisks(config, /*create=*/true).ok());
  EXPECT_TRUE(std::filesystem::is_directory(writable));
  EXPECT_TRUE(std::filesystem::is_empty(writable));
  std::filesystem::remove(file);
}

}  // namespace PST_FILE_ID
}  // namespace pst
