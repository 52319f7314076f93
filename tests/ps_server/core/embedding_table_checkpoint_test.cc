// The embedding tables' checkpoints, which round-trip and refuse what does not fit.
#include "ps_server/core/embedding_table.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <latch>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/embedding_config.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/embedding_init.h"
#include "tests/ps_server/core/embedding_table_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace embedding_testing;  // NOLINT(build/namespaces)

// --- Checkpoints ---

TEST(EmbeddingTableTest, ACheckpointRoundTripsRowsStateAndCountersAndTrainsOnAlike) {
  EmbeddingTableOptions options = Options(1, 2);
  std::unique_ptr<EmbeddingTable> table =
      Make({Refusing(Spec("a", 3, Adam(0.01f), 5, 0.1f)), Spec("w", 2, Ftrl(0.1f, 1, 0.01f, 0))},
           options);
  const std::vector<uint64_t> ids = IdsOfShard(1, 2, 8);
  for (int step = 0; step < 3; ++step) {
    std::vector<uint64_t> some(ids.begin() + step, ids.begin() + step + 6);
    std::vector<float> ga(some.size() * 3), gw(some.size() * 2);
    for (size_t i = 0; i < ga.size(); ++i) ga[i] = 0.1f * (i + step) - 0.5f;
    for (size_t i = 0; i < gw.size(); ++i) gw[i] = 0.2f * (i % 3) - 0.1f;
    ASSERT_TRUE(Apply(*table, Push({Rows("a", some, ga), Rows("w", some, gw)})).ok());
  }
  const ShardCheckpoint checkpoint = Exported(*table);
  EXPECT_EQ(checkpoint.embeddings(0).num_shards(), 2);
  EXPECT_EQ(checkpoint.embeddings(0).seed(), kSeed);
  EXPECT_GT(checkpoint.embeddings(0).rows_refused(), 0);

  // A restarted shard, whatever its seed option: the checkpoint's rules.
  options.seed = 99;
  EmbeddingTable restored(options);
  ASSERT_TRUE(restored.Restore(checkpoint).ok());
  EXPECT_TRUE(restored.initialized());
  EXPECT_EQ(Snapshot(restored), checkpoint.SerializeAsString());
  EXPECT_EQ(Lookup(restored, "a", ids), Lookup(*table, "a", ids));  // unseen ids too
  const PushRequest next =
      Push({Rows("a", {ids[0], ids[7]}, {1, 2, 3, 4, 5, 6}), Rows("w", {ids[1]}, {0.5f, -0.5f})});
  ASSERT_TRUE(Apply(*table, next).ok());
  ASSERT_TRUE(Apply(restored, next).ok());
  EXPECT_EQ(Snapshot(restored), Snapshot(*table));
}

// The shard captures a checkpoint under its lock and writes it out after
// releasing it, while pushes apply: the checkpoint holds the rows as they
// were at the capture.
TEST(EmbeddingTableTest, ACapturedCheckpointHoldsTheRowsOfItsCaptureWhilePushesApply) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 2, Adagrad(0.1f, 0.1f))});
  const int rows = 3 * static_cast<int>(RowStore::kRowsPerBlock) + 5;
  std::vector<uint64_t> ids(rows);
  for (int i = 0; i < rows; ++i) ids[i] = uint64_t{0x9e3779b97f4a7c15} * (i + 1);
  ASSERT_TRUE(Apply(*table, Push({Rows("a", ids, std::vector<float>(rows * 2, 1.0f))})).ok());
  const std::string at_capture = Snapshot(*table);
  const std::vector<float> values_at_capture = Lookup(*table, "a", ids);

  ShardSnapshot snapshot;
  table->Capture(&snapshot);
  EXPECT_EQ(snapshot.checkpoint.embeddings_size(), 0);  // nothing copied yet
  // Pushes after the capture: every row again, and a new one.
  std::vector<uint64_t> more = ids;
  more.push_back(12345);
  ASSERT_TRUE(Apply(*table, Push({Rows("a", more, std::vector<float>(more.size() * 2, -2.0f))}))
                  .ok());
  const std::string after_pushes = Snapshot(*table);
  ASSERT_NE(after_pushes, at_capture);

  const ShardCheckpoint checkpoint = std::move(snapshot).Finish();
  EXPECT_EQ(checkpoint.SerializeAsString(), at_capture);
  EXPECT_EQ(Snapshot(*table), after_pushes);
  EmbeddingTable restored(Options());
  ASSERT_TRUE(restored.Restore(checkpoint).ok());
  EXPECT_EQ(Lookup(restored, "a", ids), values_at_capture);
}

TEST(EmbeddingTableTest, RestoreRefusesAnInconsistentCheckpointAndChangesNothing) {
  EmbeddingTableOptions options = Options(0, 2);
  std::unique_ptr<EmbeddingTable> source = Make({Spec("a", 2, Adagrad(0.1f, 0.1f), 10)}, options);
  const std::vector<uint64_t> mine = IdsOfShard(0, 2, 3), theirs = IdsOfShard(1, 2, 1);
  ASSERT_TRUE(Apply(*source, Push({Rows("a", mine, {1, 2, 3, 4, 5, 6})})).ok());
  const ShardCheckpoint good = Exported(*source);

  struct Case {
    const char* name;
    void (*edit)(ShardCheckpoint::Embedding*, uint64_t theirs);
    const char* message;
  };
  const Case cases[] = {
      {"another shard count", [](ShardCheckpoint::Embedding* e, uint64_t) { e->set_num_shards(3); },
       "placed over 3 shards"},
      {"another shard's row",
       [](ShardCheckpoint::Embedding* e, uint64_t theirs) {
         std::memcpy(e->mutable_ids()->data() + 8, &theirs, 8);
       },
       "belongs to shard 1"},
      {"a repeated id",
       [](ShardCheckpoint::Embedding* e, uint64_t) {
         e->mutable_ids()->replace(8, 8, e->ids().substr(0, 8));
       },
       "appears twice"},
      {"values cut short",
       [](ShardCheckpoint::Embedding* e, uint64_t) { e->mutable_values()->pop_back(); }, "sizes"},
      {"state of another optimizer",
       [](ShardCheckpoint::Embedding* e, uint64_t) {
         *e->mutable_config()->mutable_optimizer() = Adam(0.1f);
       },
       "sizes"},
      {"a NaN value",
       [](ShardCheckpoint::Embedding* e, uint64_t) {
         const float nan = std::numeric_limits<float>::quiet_NaN();
         std::memcpy(e->mutable_values()->data() + 4, &nan, 4);
       },
       "non-finite"},
      {"a negative update count (a row seeded at Init has 0)",
       [](ShardCheckpoint::Embedding* e, uint64_t) { e->mutable_row_updates()->assign(24, '\xff'); },
       "negative update count"},
      {"more rows than its limit",
       [](ShardCheckpoint::Embedding* e, uint64_t) {
         e->mutable_config()->set_max_rows_per_shard(2);
       },
       "limit"},
      {"fewer rows admitted than held",
       [](ShardCheckpoint::Embedding* e, uint64_t) { e->set_rows_admitted(2); }, "counters"},
      {"a bad spec",
       [](ShardCheckpoint::Embedding* e, uint64_t) { e->mutable_config()->set_dim(0); }, "dim"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ShardCheckpoint bad = good;
    c.edit(bad.mutable_embeddings(0), theirs[0]);
    std::unique_ptr<EmbeddingTable> table = Make({Spec("b", 1)}, options);
    ASSERT_TRUE(Apply(*table, Push({Rows("b", {mine[0]}, {1})})).ok());
    const std::string before = Snapshot(*table);
    absl::Status status = table->Restore(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("\"a\""));
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_EQ(Snapshot(*table), before);
    EmbeddingTable fresh(options);
    EXPECT_FALSE(fresh.Restore(bad).ok());
    EXPECT_FALSE(fresh.initialized());
  }

  ShardCheckpoint twice = good;
  *twice.add_embeddings() = good.embeddings(0);
  EmbeddingTable fresh(options);
  EXPECT_THAT(fresh.Restore(twice).message(), HasSubstr("appears twice"));
}

TEST(EmbeddingTableTest, ACheckpointWithoutEmbeddingsRestoresAnEmptyTable) {
  EmbeddingTable table(Options());
  ASSERT_TRUE(table.Restore(ShardCheckpoint()).ok());
  EXPECT_TRUE(table.initialized());
  EXPECT_EQ(table.dim("a"), 0);
}

}  // namespace PST_FILE_ID
}  // namespace pst
