// Delta checkpoints of embedding tables: a chain (a full capture, then
// deltas of the rows changed and the ids removed since the capture before)
// gives exactly what a full checkpoint at its last version holds, for a
// table all in RAM that evicts and expires rows and for one over a disk
// tier; a restored chain trains on as the table itself.

#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/checkpoint_delta.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/shard_snapshot.h"
#include "tests/ps_server/core/embedding_table_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace embedding_testing;  // NOLINT(build/namespaces)

// The header of a table's part: everything but its rows.
std::string HeaderOf(ShardCheckpoint::Embedding e) {
  e.clear_ids();
  e.clear_values();
  e.clear_slots();
  e.clear_row_updates();
  e.clear_removed_ids();
  return e.SerializeAsString();
}

// A capture of `kind` at `version` (a delta's parent one version before).
ShardSnapshot Capture(EmbeddingTable& table, CaptureKind kind, int64_t version, int64_t base) {
  ShardSnapshot snapshot;
  snapshot.kind = kind;
  snapshot.checkpoint.set_version(version);
  if (kind == CaptureKind::kChainDelta) {
    snapshot.checkpoint.set_delta(true);
    snapshot.checkpoint.set_parent_version(version - 1);
    snapshot.checkpoint.set_base_version(base);
  }
  table.Capture(&snapshot);
  return snapshot;
}

// One step over a random part of 48 ids (some new, some on disk, some
// left to expire).
absl::Status Train(EmbeddingTable& table, int dim, std::mt19937* random,
                   std::set<uint64_t>* trained = nullptr) {
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 48; ++id) {
    if ((*random)() % 4 == 0) ids.push_back(id * 0x9e3779b97f4a7c15ULL);
  }
  std::vector<float> gradients;
  for (size_t i = 0; i < ids.size() * dim; ++i) {
    gradients.push_back(0.01f * static_cast<float>((*random)() % 21) - 0.1f);
  }
  if (trained != nullptr) trained->insert(ids.begin(), ids.end());
  return Apply(table, Push({Rows("t", ids, gradients)}));
}

struct Case {
  const char* name;
  EmbeddingTableConfig spec;
  // Whether new rows evict old ones: which ones follows the order of the
  // rows in RAM, which a restore from a chain and one from a full
  // checkpoint need not share, so the two train on alike only without.
  bool evicts;
};

// `checkpoint` with its tables' disk tiers under `dir`: a restored table
// must not empty the directory of the table it was taken from.
ShardCheckpoint DiskElsewhere(ShardCheckpoint checkpoint, const std::string& dir) {
  for (ShardCheckpoint::Embedding& e : *checkpoint.mutable_embeddings()) {
    if (!e.config().storage().disk().empty()) e.mutable_config()->mutable_storage()->set_disk(dir);
  }
  return checkpoint;
}

void ExpectChainGivesTheFullCheckpoint(const Case& c) {
  SCOPED_TRACE(c.name);
  const int dim = c.spec.dim();
  std::unique_ptr<EmbeddingTable> table = Make({c.spec});
  std::mt19937 random(7);
  for (int step = 0; step < 6; ++step) ASSERT_TRUE(Train(*table, dim, &random).ok());
  ASSERT_FALSE(table->TracksChanges());
  ShardCheckpoint state = std::move(Capture(*table, CaptureKind::kChainStart, 1, 1)).Finish();
  ASSERT_TRUE(table->TracksChanges());
  int removed = 0;
  std::set<uint64_t> trained;
  for (int64_t version = 2; version <= 4; ++version) {
    for (int step = 0; step < 5; ++step) ASSERT_TRUE(Train(*table, dim, &random, &trained).ok());
    // A delta and a whole capture at once, both finished after the table
    // trained on: each holds the rows of its capture.
    ShardSnapshot delta = Capture(*table, CaptureKind::kChainDelta, version, 1);
    ShardSnapshot whole = Capture(*table, CaptureKind::kWhole, version, 1);
    std::set<uint64_t> trained_after;
    ASSERT_TRUE(Train(*table, dim, &random, &trained_after).ok());
    ShardCheckpoint full = std::move(whole).Finish();
    ShardCheckpoint part = std::move(delta).Finish();
    ASSERT_TRUE(part.incomplete().empty()) << part.incomplete();
    // Only what changed: rows trained since the capture before.
    for (const auto& [id, row] : RowsOf(part.embeddings(0))) {
      EXPECT_TRUE(trained.contains(id)) << id;
    }
    trained = std::move(trained_after);
    removed += static_cast<int>(part.embeddings(0).removed_ids().size() / 8);
    absl::StatusOr<ShardCheckpoint> applied = ApplyDelta(std::move(state), std::move(part));
    ASSERT_TRUE(applied.ok()) << applied.status();
    state = *std::move(applied);
    EXPECT_FALSE(state.delta());
    EXPECT_EQ(state.version(), version);
    EXPECT_EQ(RowsOf(state.embeddings(0)), RowsOf(full.embeddings(0)));
    EXPECT_EQ(HeaderOf(state.embeddings(0)), HeaderOf(full.embeddings(0)));
  }
  EXPECT_GT(removed, 0);  // evicted or expired ids went out through the deltas

  // Restored from the chain, the table holds and trains on as the table
  // restored from a full checkpoint at the same version.
  const ShardCheckpoint full = Exported(*table);
  // The table trained one step past version 4: one more delta brings the
  // chain there.
  ShardCheckpoint last = std::move(Capture(*table, CaptureKind::kChainDelta, 5, 1)).Finish();
  absl::StatusOr<ShardCheckpoint> now = ApplyDelta(std::move(state), std::move(last));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(RowsOf(now->embeddings(0)), RowsOf(full.embeddings(0)));
  EXPECT_EQ(HeaderOf(now->embeddings(0)), HeaderOf(full.embeddings(0)));

  // Restored from the chain and from the full checkpoint: the same rows
  // and counters, and they train on alike.
  EmbeddingTable from_chain(Options()), from_full(Options());
  ASSERT_TRUE(from_chain.Restore(DiskElsewhere(*now, FreshDir("delta_tiers_chain"))).ok());
  ASSERT_TRUE(from_full.Restore(DiskElsewhere(full, FreshDir("delta_tiers_full"))).ok());
  EXPECT_EQ(RowsOf(Exported(from_chain).embeddings(0)), RowsOf(full.embeddings(0)));
  if (c.evicts) return;
  std::mt19937 same(11), again(11);
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(Train(from_full, dim, &same).ok());
    ASSERT_TRUE(Train(from_chain, dim, &again).ok());
  }
  EXPECT_EQ(RowsOf(Exported(from_chain).embeddings(0)), RowsOf(Exported(from_full).embeddings(0)));
  ShardCheckpoint::Embedding a = Exported(from_chain).embeddings(0);
  ShardCheckpoint::Embedding b = Exported(from_full).embeddings(0);
  // Not which rows went between the tiers since: that follows which rows
  // a restore put in RAM, and a chain's rows come in another order.
  for (ShardCheckpoint::Embedding* e : {&a, &b}) {
    e->clear_config();
    e->clear_rows_demoted();
    e->clear_rows_promoted();
  }
  EXPECT_EQ(HeaderOf(a), HeaderOf(b));
}

TEST(EmbeddingTableDeltaTest, AChainInRamGivesTheFullCheckpointOfItsVersion) {
  // 16 rows at most: new rows evict the least recently used.
  EmbeddingTableConfig spec = Spec("t", 3, Adam(0.01f), 16, 0.1f);
  ExpectChainGivesTheFullCheckpoint({"evicting, adam", spec, /*evicts=*/true});
  EmbeddingTableConfig expiring = Spec("t", 2, Adagrad(0.1f, 0.1f), 0, 0.1f);
  expiring.mutable_storage()->set_ttl_steps(8);
  ExpectChainGivesTheFullCheckpoint({"expiring, adagrad", expiring, /*evicts=*/false});
}

TEST(EmbeddingTableDeltaTest, AChainOverADiskTierGivesTheFullCheckpointOfItsVersion) {
  // A RAM budget of about 4 rows: most rows live on disk, and every step
  // promotes and demotes some; rows untouched for 12 updates expire.
  EmbeddingTableConfig spec = Spec("t", 4, Adam(0.01f), 0, 0.1f);
  spec.mutable_storage()->set_memory_bytes(4 * (4 * 3 * 4 + 16 + 8 + 2 * 13));
  spec.mutable_storage()->set_disk(FreshDir("delta_tiers"));
  spec.mutable_storage()->set_ttl_steps(12);
  ExpectChainGivesTheFullCheckpoint({"tiered, adam", spec, /*evicts=*/false});
}

// A whole capture (what Snapshot takes for others than the writer) leaves
// the changes tracked for the chain's next delta.
TEST(EmbeddingTableDeltaTest, AWholeCaptureLeavesTheChainsChangesAlone) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("t", 2, Sgd(0.1f), 0, 0.1f)});
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {1, 2, 3}, std::vector<float>(6, 1.0f))})).ok());
  ShardCheckpoint state = std::move(Capture(*table, CaptureKind::kChainStart, 1, 1)).Finish();
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {2, 4}, std::vector<float>(4, 1.0f))})).ok());
  std::move(Capture(*table, CaptureKind::kWhole, 2, 1)).Finish();
  ShardCheckpoint delta = std::move(Capture(*table, CaptureKind::kChainDelta, 2, 1)).Finish();
  EXPECT_EQ(RowsOf(delta.embeddings(0)).size(), 2u);
  absl::StatusOr<ShardCheckpoint> applied = ApplyDelta(std::move(state), std::move(delta));
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(RowsOf(applied->embeddings(0)), RowsOf(Exported(*table).embeddings(0)));
}

// Restore starts the tracking over: a chain's first link after it is full.
TEST(EmbeddingTableDeltaTest, ARestoredTableTracksNothingUntilItsChainStarts) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("t", 2, Sgd(0.1f), 0, 0.1f)});
  ASSERT_TRUE(Apply(*table, Push({Rows("t", {1, 2}, std::vector<float>(4, 1.0f))})).ok());
  std::move(Capture(*table, CaptureKind::kChainStart, 1, 1)).Finish();
  EXPECT_TRUE(table->TracksChanges());
  ASSERT_TRUE(table->Restore(Exported(*table)).ok());
  EXPECT_FALSE(table->TracksChanges());
}

}  // namespace PST_FILE_ID
}  // namespace pst
