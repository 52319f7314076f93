// Checkpoint chains (CheckpointConfig.full_every): a full checkpoint, then
// deltas over the one before; their files' names, what `keep` keeps, and
// what restores when a link is torn or missing.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/checkpoint.h"
#include "ps_server/core/checkpointer.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/checkpoint_testing.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace shard_embedding_testing;  // NOLINT(build/namespaces)

using checkpoint_testing::FreshDir;

TEST(CheckpointChainTest, FileNamesSayTheVersionAndADeltasParent) {
  struct Case {
    const char* name;
    bool valid;
    int64_t version;
    bool delta;
    int64_t parent;
  };
  const Case cases[] = {
      {"ckpt-000000000000042.bin", true, 42, false, -1},
      {"ckpt-000000000000042.delta-000000000000040.bin", true, 42, true, 40},
      {"ckpt-000000000000042.delta-000000000000042.bin", false, 0, false, 0},  // its own parent
      {"ckpt-000000000000042.delta-.bin", false, 0, false, 0},
      {"ckpt-000000000000042.tmp", false, 0, false, 0},
      {"ckpt-torn.bin", false, 0, false, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::optional<CheckpointName> name = ParseCheckpointName(c.name);
    ASSERT_EQ(name.has_value(), c.valid);
    if (!c.valid) continue;
    EXPECT_EQ(name->version, c.version);
    EXPECT_EQ(name->delta, c.delta);
    EXPECT_EQ(name->parent_version, c.parent);
  }
}

// A shard with the table "emb" whose checkpoints chain 3 links at most;
// each step trains a few rows, some again, and the dense "b".
class CheckpointChainShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.set_dir(FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    config_.set_full_every(3);
    config_.set_keep(2);
    shard_ = Shard();
  }
  std::unique_ptr<ParameterShard> Shard() const {
    ShardOptions options = Options(ASYNC, 1);
    options.checkpoint_full_every = config_.full_every();
    auto shard = MakeShard(options);
    return shard;
  }
  std::string ShardDir() const { return config_.dir() + "/shard-0"; }
  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const std::string& file : ListCheckpoints(ShardDir())) {
      names.push_back(std::filesystem::path(file).filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  void Step() {
    const int64_t v = shard_->version();
    const std::vector<uint64_t> ids = {uint64_t(100 + v % 5), uint64_t(10 + v), uint64_t(3)};
    std::vector<float> g(ids.size() * kDim);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>((i + v) % 7) - 0.02f;
    PushResponse response;
    const absl::Status pushed = Push(*shard_, RowPush(0, v, ids, g), &response);
    ASSERT_TRUE(pushed.ok()) << pushed;
  }
  // Trains a step and checkpoints it; remembers the shard's state then.
  void StepAndCheckpoint(Checkpointer& checkpointer) {
    Step();
    absl::StatusOr<Checkpointer::Written> written = checkpointer.CheckpointNow();
    ASSERT_TRUE(written.ok()) << written.status();
    states_[shard_->version()] = shard_->Snapshot();
  }

  CheckpointConfig config_;
  std::unique_ptr<ParameterShard> shard_;
  std::map<int64_t, ShardCheckpoint> states_;
};

std::string File(int64_t version) { return absl::StrFormat("ckpt-%015d.bin", version); }
std::string Delta(int64_t version, int64_t parent) {
  return absl::StrFormat("ckpt-%015d.delta-%015d.bin", version, parent);
}

// Rows by id, so that two checkpoints of the same state compare equal
// whatever the order of their rows.
std::map<uint64_t, std::string> RowsById(const ShardCheckpoint& checkpoint) {
  std::map<uint64_t, std::string> rows;
  const ShardCheckpoint::Embedding& e = checkpoint.embeddings(0);
  const size_t n = e.ids().size() / 8;
  for (size_t i = 0; i < n; ++i) {
    uint64_t id;
    std::memcpy(&id, e.ids().data() + i * 8, 8);
    rows[id] = e.values().substr(i * e.values().size() / n, e.values().size() / n) +
               e.slots().substr(i * e.slots().size() / n, e.slots().size() / n) +
               e.row_updates().substr(i * 8, 8);
  }
  return rows;
}

// The state a restore gives equals the shard's at that version.
void ExpectSameState(const ShardCheckpoint& restored, const ShardCheckpoint& original) {
  EXPECT_EQ(restored.version(), original.version());
  EXPECT_FALSE(restored.delta());
  EXPECT_EQ(RowsById(restored), RowsById(original));
  ShardCheckpoint a = restored, b = original;
  for (ShardCheckpoint* c : {&a, &b}) {
    for (ShardCheckpoint::Embedding& e : *c->mutable_embeddings()) {
      e.clear_ids();
      e.clear_values();
      e.clear_slots();
      e.clear_row_updates();
    }
    c->clear_run_id();
    c->clear_config_hash();
    c->clear_finished();
  }
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
}

TEST_F(CheckpointChainShardTest, EveryNthCheckpointIsFullAndKeepSparesTheChainsLinks) {
  Init(shard_.get());
  Checkpointer checkpointer(shard_.get(), config_, 0, {"", "job"});
  for (int i = 0; i < 4; ++i) StepAndCheckpoint(checkpointer);
  // The newest two, and the links the newer one's chain goes back through.
  EXPECT_THAT(Files(), ElementsAre(File(1), Delta(2, 1), Delta(3, 2), File(4)));
  for (int i = 0; i < 2; ++i) StepAndCheckpoint(checkpointer);
  EXPECT_THAT(Files(), ElementsAre(File(4), Delta(5, 4), Delta(6, 5)));
  StepAndCheckpoint(checkpointer);
  EXPECT_THAT(Files(), ElementsAre(File(4), Delta(5, 4), Delta(6, 5), File(7)));

  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> newest = ReadNewestValidCheckpoint(ShardDir(), &rejected);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_TRUE(rejected.empty());
  ExpectSameState(*newest, states_[7]);
  std::filesystem::remove(ShardDir() + "/" + File(7));
  newest = ReadNewestValidCheckpoint(ShardDir(), &rejected);
  ASSERT_TRUE(newest.ok()) << newest.status();
  ExpectSameState(*newest, states_[6]);  // the chain 4, 5, 6 applied

  // A restarted PS restores the chain, and its next checkpoint is full.
  auto restarted = Shard();
  Checkpointer again(restarted.get(), config_, 0, {"", "job"});
  absl::StatusOr<int64_t> start = again.Prepare(CheckpointStart::kAuto);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(*start, 6);
  ExpectSameState(restarted->Snapshot(), states_[6]);
  shard_ = std::move(restarted);
  StepAndCheckpoint(again);
  EXPECT_THAT(Files(), ::testing::Contains(File(7)));
}

TEST_F(CheckpointChainShardTest, ATornOrMissingLinkFallsBackToTheNewestWholeChain) {
  config_.set_keep(10);
  config_.set_full_every(4);
  shard_ = Shard();
  Init(shard_.get());
  Checkpointer checkpointer(shard_.get(), config_, 0, {"", "job"});
  for (int i = 0; i < 4; ++i) StepAndCheckpoint(checkpointer);
  ASSERT_THAT(Files(), ElementsAre(File(1), Delta(2, 1), Delta(3, 2), Delta(4, 3)));

  struct Case {
    const char* name;
    void (*damage)(const std::string& file);
    std::string file;   // the link damaged
    int64_t restores;   // -1: nothing restores
    size_t rejections;  // files rejected before
    std::string why;    // what each rejection says
    std::string names;  // and the link it names
  };
  const auto tear = [](const std::string& file) {
    std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  };
  const auto lose = [](const std::string& file) { std::filesystem::remove(file); };
  const Case cases[] = {
      {"the newest delta torn", tear, Delta(4, 3), 3, 1, "is torn", Delta(4, 3)},
      {"a middle delta torn", tear, Delta(3, 2), 2, 2, "is torn", Delta(3, 2)},
      {"a middle delta missing", lose, Delta(3, 2), 2, 1, "does not hold", "delta at version 3"},
      {"the full one torn", tear, File(1), -1, 4, "is torn", File(1)},
  };
  const std::string saved = FreshDir("chain_saved");
  std::filesystem::copy(ShardDir(), saved);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::filesystem::remove_all(ShardDir());
    std::filesystem::copy(saved, ShardDir());
    c.damage(ShardDir() + "/" + c.file);
    std::vector<std::string> rejected;
    absl::StatusOr<ShardCheckpoint> newest = ReadNewestValidCheckpoint(ShardDir(), &rejected);
    ASSERT_EQ(rejected.size(), c.rejections) << ::testing::PrintToString(rejected);
    for (const std::string& reason : rejected) {
      EXPECT_THAT(reason, HasSubstr(c.why));
      EXPECT_THAT(reason, HasSubstr(c.names));
    }
    if (c.restores < 0) {
      EXPECT_EQ(newest.status().code(), absl::StatusCode::kNotFound);
      continue;
    }
    ASSERT_TRUE(newest.ok()) << newest.status();
    ExpectSameState(*newest, states_[c.restores]);
  }
}

// A link that fails to be written starts the chain over: the next
// checkpoint is full, never a delta over a file that is not there.
TEST_F(CheckpointChainShardTest, AFailedWriteStartsTheChainOver) {
  Init(shard_.get());
  int calls = 0;
  Checkpointer checkpointer(shard_.get(), config_, 0, {"", "job"},
                            [&calls](const std::string& dir, const ShardCheckpoint& checkpoint,
                                     int keep) -> absl::StatusOr<std::string> {
                              if (++calls == 2) return absl::UnavailableError("disk full");
                              return WriteCheckpoint(dir, checkpoint, keep);
                            });
  Step();
  ASSERT_TRUE(checkpointer.CheckpointNow().ok());
  Step();
  ASSERT_FALSE(checkpointer.CheckpointNow().ok());
  Step();
  ASSERT_TRUE(checkpointer.CheckpointNow().ok());
  Step();
  ASSERT_TRUE(checkpointer.CheckpointNow().ok());
  EXPECT_THAT(Files(), ElementsAre(File(3), Delta(4, 3)));  // keep 2: the first chain went
}

// Scheduled links (every_steps) chain as the writer writes them; the
// final checkpoint at Stop, after the writer let go, is full, so a link
// scheduled and never taken is no parent of it.
TEST_F(CheckpointChainShardTest, ScheduledLinksChainAndTheFinalCheckpointIsWhole) {
  config_.set_every_steps(2);
  config_.set_keep(10);
  ShardOptions options = Options(ASYNC, 1);
  options.checkpoint_full_every = config_.full_every();
  options.snapshot_every_steps = config_.every_steps();
  shard_ = MakeShard(options);
  Init(shard_.get());
  Checkpointer checkpointer(shard_.get(), config_, 0, {"", "job"});
  checkpointer.Start();
  for (int i = 0; i < 7; ++i) Step();  // each waits for the scheduled write before it
  checkpointer.Stop();
  EXPECT_THAT(Files(), ElementsAre(File(2), Delta(4, 2), Delta(6, 4), File(7)));
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> newest = ReadNewestValidCheckpoint(ShardDir(), &rejected);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_TRUE(rejected.empty()) << ::testing::PrintToString(rejected);
  ExpectSameState(*newest, shard_->Snapshot());
  ASSERT_TRUE(ReadCheckpoint(ShardDir() + "/" + Delta(6, 4)).ok());
  std::filesystem::remove(ShardDir() + "/" + File(7));
  newest = ReadNewestValidCheckpoint(ShardDir(), &rejected);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->version(), 6);
}

// A delta of a shard without embedding tables would hold all of it: every
// file is full.
TEST_F(CheckpointChainShardTest, AShardWithoutEmbeddingTablesWritesFullCheckpointsOnly) {
  InitRequest init;
  EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{0, 0}, init.add_variables());
  InitResponse initialized;
  ASSERT_TRUE(shard_->Init(init, &initialized).ok());
  Checkpointer checkpointer(shard_.get(), config_, 0, {"", "job"});
  for (int i = 0; i < 3; ++i) {
    PushRequest push;
    push.set_computed_at_version(shard_->version());
    EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{1, 1}, push.add_gradients());
    PushResponse response;
    ASSERT_TRUE(Push(*shard_, push, &response).ok());
    ASSERT_TRUE(checkpointer.CheckpointNow().ok());
  }
  EXPECT_THAT(Files(), ElementsAre(File(2), File(3)));
}

}  // namespace PST_FILE_ID
}  // namespace pst
