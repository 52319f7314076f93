// Replicated shards under pslaunch: configs/ctr.textproto, scaled down,
// with a backup per shard (cluster.ps_backups, ports the system picks).
// SYNC trains as without backups, to the last digit of the summary, and
// each backup's final checkpoint holds bitwise its primary's variables,
// rows and optimizer state.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "ps_server/core/checkpoint.h"
#include "result.pb.h"
#include "tests/support/commands.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The shipped CTR config with ports the system picks, its data and
// checkpoints in `dir`, fewer examples, and `cluster_extra` in its cluster.
std::string CtrConfig(const std::string& dir, const std::string& name,
                      const std::string& cluster_extra) {
  std::string text = ReadFile(absl::StrCat(PST_SOURCE_DIR, "/configs/ctr.textproto"));
  const int replaced = absl::StrReplaceAll(
      {{"127.0.0.1:50061", "127.0.0.1:0"},
       {"127.0.0.1:50062", "127.0.0.1:0"},
       {"  workers: 2\n", absl::StrCat("  workers: 2\n", cluster_extra)},
       {"  seed: 1\n",
        absl::StrCat("  seed: 1\n  checkpoint { dir: \"", dir, "/", name, "-checkpoints\" }\n")},
       {"/tmp/pstrain-ctr", dir},
       {"train_examples: 500000", "train_examples: 30000"},
       {"test_examples: 50000", "test_examples: 5000"},
       {"distinct: 100000", "distinct: 20000"}},
      &text);
  EXPECT_EQ(replaced, 9) << "configs/ctr.textproto changed: update this test's replacements";
  const std::string path = absl::StrCat(dir, "/", name, ".textproto");
  std::ofstream(path) << text;
  return path;
}

// The newest checkpoint that restores in `dir`.
ShardCheckpoint Newest(const std::string& dir) {
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dir, &rejected);
  EXPECT_TRUE(checkpoint.ok()) << dir << ": " << checkpoint.status();
  return checkpoint.ok() ? *std::move(checkpoint) : ShardCheckpoint();
}

// A table's rows by id: values, optimizer state and update count, as bytes.
std::map<uint64_t, std::tuple<std::string, std::string, std::string>> RowsOf(
    const ShardCheckpoint::Embedding& table) {
  std::map<uint64_t, std::tuple<std::string, std::string, std::string>> rows;
  const size_t n = table.ids().size() / sizeof(uint64_t);
  const size_t values = n > 0 ? table.values().size() / n : 0;
  const size_t slots = n > 0 ? table.slots().size() / n : 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t id;
    std::memcpy(&id, table.ids().data() + i * sizeof(id), sizeof(id));
    rows[id] = {table.values().substr(i * values, values), table.slots().substr(i * slots, slots),
                table.row_updates().substr(i * sizeof(int64_t), sizeof(int64_t))};
  }
  return rows;
}

// The summary line's AUC, loss and steps, as printed.
std::string Summary(const CommandResult& run) {
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  if (lines.empty()) return "";
  RunSummary summary;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(lines.back(), &summary).ok())
      << lines.back();
  return absl::StrCat(summary.test_auc(), " ", summary.test_logloss(), " ", summary.steps());
}

TEST(ReplicationTest, SyncWithABackupPerShardTrainsAsWithoutAndTheBackupsEndAsTheirPrimaries) {
  const std::string dir = absl::StrCat(ScratchDir(), "/replication");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  struct RemoveAtEnd {
    std::string dir;
    ~RemoveAtEnd() { std::filesystem::remove_all(dir); }
  } remove_at_end{dir};
  const std::string plain = CtrConfig(dir, "plain", "");
  const std::string replicated = CtrConfig(
      dir, "replicated",
      "  ps_backups { address: \"127.0.0.1:0\" }\n  ps_backups { address: \"127.0.0.1:0\" }\n");

  const CommandResult without =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", plain, " --mode=sync"), 500);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  const CommandResult with =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", replicated, " --mode=sync"), 500);
  ASSERT_EQ(with.exit_code, 0) << with.err;
  EXPECT_THAT(with.err, HasSubstr("ps:0:1"));
  EXPECT_THAT(with.err, HasSubstr("ps:1:1"));
  EXPECT_EQ(Summary(with), Summary(without));

  for (int shard = 0; shard < 2; ++shard) {
    SCOPED_TRACE(absl::StrCat("shard ", shard));
    const ShardCheckpoint primary =
        Newest(absl::StrCat(dir, "/replicated-checkpoints/shard-", shard));
    const ShardCheckpoint backup =
        Newest(absl::StrCat(dir, "/replicated-checkpoints/replica-1/shard-", shard));
    EXPECT_GT(primary.version(), 0);
    EXPECT_EQ(backup.version(), primary.version());
    ASSERT_EQ(backup.variables_size(), primary.variables_size());
    for (int v = 0; v < primary.variables_size(); ++v) {
      EXPECT_EQ(backup.variables(v).SerializeAsString(), primary.variables(v).SerializeAsString())
          << primary.variables(v).name();
    }
    ASSERT_EQ(backup.embeddings_size(), 2);
    ASSERT_EQ(primary.embeddings_size(), 2);
    for (int t = 0; t < 2; ++t) {
      EXPECT_GT(primary.embeddings(t).ids().size(), 0u);
      EXPECT_TRUE(RowsOf(backup.embeddings(t)) == RowsOf(primary.embeddings(t)))
          << primary.embeddings(t).config().name();
      EXPECT_EQ(backup.embeddings(t).updates(), primary.embeddings(t).updates());
    }
  }
}

}  // namespace
}  // namespace pst
