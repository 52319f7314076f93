// A shard whose embedding table has a disk tier: SYNC steps of two
// workers through the shard's own calls give, pull for pull, the rows of
// the same shard all in RAM, and its checkpoint restores into a new shard.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)

std::string FreshDir(const std::string& name) { return FreshScratchDir(name); }

// "b" and the table "emb" under Adam; with `dir`, 4 rows of it in RAM
// (Adam: two slots a value) and the rest on disk there.
void InitTiered(ParameterShard* shard, const std::string& dir) {
  InitRequest init;
  EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{0, 0}, init.add_variables());
  EmbeddingTableConfig* table = init.add_embeddings();
  table->set_name("emb");
  table->set_dim(kDim);
  table->mutable_optimizer()->mutable_adam()->set_learning_rate(0.01f);
  if (!dir.empty()) {
    table->mutable_storage()->set_memory_bytes(4 * (kDim * 3 * 4 + 50));
    table->mutable_storage()->set_disk(dir);
  }
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  ASSERT_TRUE(response.accepted());
}

// `steps` SYNC steps: each worker pushes a draw of ids of [0, 40).
void Train(ParameterShard* shard, int from, int steps) {
  std::mt19937_64 draw(from + 3);
  for (int step = from; step < from + steps; ++step) {
    for (int w = 0; w < 2; ++w) {
      std::vector<uint64_t> ids;
      for (uint64_t id = 0; id < 40; ++id) {
        if (draw() % 6 == 0) ids.push_back(id);
      }
      PushResponse response;
      const PushRequest push = RowPush(w, step, ids, Gradients(w + step % 5, ids));
      ASSERT_TRUE(Push(*shard, push, &response).ok());
      ASSERT_EQ(response.outcome(), w == 1 ? PushResponse::APPLIED : PushResponse::AGGREGATED);
    }
  }
}

std::vector<uint64_t> AllIds() {
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 48; ++id) ids.push_back(id);
  return ids;
}

EmbeddingTableStats TableStats(ParameterShard* shard) {
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.embeddings_size(), 1);
  return stats.embeddings_size() == 1 ? stats.embeddings(0) : EmbeddingTableStats();
}

TEST(ParameterShardTiersTest, SyncStepsOverADiskTierPullAsTheShardAllInRam) {
  const std::string dir = FreshDir("shard_tiers_sync");
  auto tiered = MakeShard(Options(SYNC, 2));
  auto ram = MakeShard(Options(SYNC, 2));
  InitTiered(tiered.get(), dir);
  InitTiered(ram.get(), "");
  Train(tiered.get(), 0, 200);
  Train(ram.get(), 0, 200);
  const EmbeddingTableStats stats = TableStats(tiered.get());
  EXPECT_GT(stats.rows_promoted(), 200 * 4);
  EXPECT_GT(stats.rows_on_disk(), 20);
  EXPECT_EQ(stats.rows_refused(), 0);
  const Pulled from_tiers = PullAll(tiered.get(), AllIds());
  const Pulled from_ram = PullAll(ram.get(), AllIds());
  EXPECT_EQ(from_tiers.version, 200);
  EXPECT_EQ(from_tiers.rows, from_ram.rows);
  EXPECT_EQ(from_tiers.dense, from_ram.dense);
}

TEST(ParameterShardTiersTest, ATieredShardsCheckpointRestoresAndTrainsOn) {
  const std::string dir = FreshDir("shard_tiers_checkpoint");
  auto ram = MakeShard(Options(SYNC, 2));
  InitTiered(ram.get(), "");
  Train(ram.get(), 0, 30);
  ShardCheckpoint checkpoint;
  {
    auto tiered = MakeShard(Options(SYNC, 2));
    InitTiered(tiered.get(), dir);
    Train(tiered.get(), 0, 30);
    ASSERT_GT(TableStats(tiered.get()).rows_on_disk(), 0);
    checkpoint = tiered->Snapshot();
  }
  auto restored = MakeShard(Options(SYNC, 2));
  ASSERT_TRUE(restored->Restore(checkpoint).ok());
  EXPECT_EQ(TableStats(restored.get()).rows_in_memory(), 4);
  EXPECT_EQ(PullAll(restored.get(), AllIds()).rows, PullAll(ram.get(), AllIds()).rows);
  Train(restored.get(), 30, 20);
  Train(ram.get(), 30, 20);
  EXPECT_EQ(PullAll(restored.get(), AllIds()).rows, PullAll(ram.get(), AllIds()).rows);
}

// A primary and its backup, both with the table's disk tier in one
// directory (each replica has its own under it) and 4 rows of RAM: the
// backup holds the primary's rows, bit for bit, after every step, though
// each keeps its own rows in RAM.
TEST(ParameterShardTiersTest, ATieredBackupHoldsThePrimarysRowsAtEveryStep) {
  const std::string dir = FreshDir("shard_tiers_replica");
  auto primary = MakeShard(replica_testing::AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(replica_testing::AsReplica(Options(SYNC, 2), 1));
  InitTiered(primary.get(), dir);
  replica_testing::Forward(*primary, *backup);
  replica_testing::ExpectSameState(*primary, *backup);
  for (int step = 0; step < 12; ++step) {
    Train(primary.get(), step, 1);
    ASSERT_EQ(replica_testing::Forward(*primary, *backup), 1);
    replica_testing::ExpectSameState(*primary, *backup);
  }
  EXPECT_GT(TableStats(primary.get()).rows_on_disk(), 0);
  EXPECT_GT(TableStats(backup.get()).rows_on_disk(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/emb-shard0-replica1"));
  std::filesystem::remove_all(dir);
}

}  // namespace PST_FILE_ID
}  // namespace pst
