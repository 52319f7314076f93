// The changes a primary's tables forward to a backup's: given those of
// every version, a backup holds the primary's rows bit for bit through new
// rows, rows evicted while an update commits, and updates discarded after
// some of their rows were staged; a commit whose changes were not exported
// before the table changed again is refused, not forwarded wrong.

#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/embedding_table.h"
#include "tests/ps_server/core/embedding_table_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace embedding_testing;  // NOLINT(build/namespaces)

EmbeddingTableOptions Forwarding() {
  EmbeddingTableOptions options = Options();
  options.forward_changes = true;
  return options;
}

// 24 rows of 64 ids: most updates add rows and evict others as they commit.
EmbeddingTableConfig SmallTable() { return Spec("t", 4, Adagrad(0.1f, 0.1f), /*max_rows=*/24); }

// An update of a random part of the 64 ids; with `overflowing`, its last
// row's gradient makes the update not finite, after the others were staged.
PushRequest Update(std::mt19937* random, bool overflowing) {
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 64; ++id) {
    if ((*random)() % 3 == 0) ids.push_back(id);
  }
  std::vector<float> gradients;
  for (size_t i = 0; i < ids.size() * 4; ++i) {
    gradients.push_back(0.01f * static_cast<float>((*random)() % 21) - 0.1f);
  }
  if (overflowing && !ids.empty()) gradients.back() = 1e30f;
  return Push({Rows("t", ids, gradients)});
}

// Forwards what `primary` changed since the last call to `backup`.
void Forward(EmbeddingTable& primary, EmbeddingTable& backup) {
  ShardCheckpoint delta;
  ASSERT_TRUE(primary.ExportChanges(&delta).ok());
  ASSERT_TRUE(backup.CheckChanges(delta).ok());
  ASSERT_TRUE(backup.ApplyChanges(delta).ok());
}

TEST(EmbeddingChangesTest, ABackupGivenEveryVersionsChangesHoldsThePrimarysRows) {
  auto primary = Make({SmallTable()}, Forwarding());
  auto backup = Make({SmallTable()});
  std::mt19937 random(11);
  int discarded = 0;
  for (int version = 1; version <= 60; ++version) {
    const bool overflowing = version % 7 == 0;
    const absl::Status applied = Apply(*primary, Update(&random, overflowing));
    EXPECT_EQ(applied.ok(), !overflowing) << applied;
    discarded += applied.ok() ? 0 : 1;
    Forward(*primary, *backup);
    ASSERT_TRUE(RowsOf(*primary) == RowsOf(*backup)) << "version " << version;
    const EmbeddingTableStats p = StatsOf(*primary, "t");
    const EmbeddingTableStats b = StatsOf(*backup, "t");
    EXPECT_EQ(p.rows_evicted(), b.rows_evicted());
  }
  EXPECT_GT(StatsOf(*primary, "t").rows_evicted(), 100);
  EXPECT_EQ(discarded, 8);
}

TEST(EmbeddingChangesTest, ACommitNotExportedBeforeTheNextUpdateIsRefusedUntilForgotten) {
  auto primary = Make({SmallTable()}, Forwarding());
  auto backup = Make({SmallTable()});
  std::mt19937 random(5);
  ASSERT_TRUE(Apply(*primary, Update(&random, false)).ok());
  ASSERT_TRUE(Apply(*primary, Update(&random, false)).ok());
  ShardCheckpoint delta;
  EXPECT_EQ(primary->ExportChanges(&delta).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(delta.embeddings_size(), 0);

  // The state goes to the backup whole, and forwarding starts anew.
  ASSERT_TRUE(backup->Restore(Exported(*primary)).ok());
  primary->ForgetChanges(/*forward=*/true);
  ASSERT_TRUE(Apply(*primary, Update(&random, false)).ok());
  Forward(*primary, *backup);
  EXPECT_TRUE(RowsOf(*primary) == RowsOf(*backup));
}

}  // namespace PST_FILE_ID
}  // namespace pst
