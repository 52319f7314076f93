#include "psctl/model_export.h"

#include <cstring>
#include <filesystem>
#include <numeric>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/placement.h"
#include "ps_server/core/checkpoint.h"
#include "ps_server/core/embedding_init.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<float> Floats(const NpzArray& a) {
  std::vector<float> out(a.data.size() / sizeof(float));
  std::memcpy(out.data(), a.data.data(), a.data.size());
  return out;
}

std::vector<int64_t> Int64s(const NpzArray& a) {
  std::vector<int64_t> out(a.data.size() / sizeof(int64_t));
  std::memcpy(out.data(), a.data.data(), a.data.size());
  return out;
}

const NpzArray* Find(const std::vector<NpzArray>& arrays, const std::string& name) {
  for (const NpzArray& a : arrays) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

// The shards' checkpoints of `model` placed over `num_shards` shards as a
// PS holds it, element e of every variable being e.
std::vector<ShardCheckpoint> Checkpoints(const std::vector<VariableSpec>& model, int num_shards) {
  std::vector<ShardCheckpoint> shards(num_shards);
  for (int s = 0; s < num_shards; ++s) shards[s].set_shard(s);
  for (const VariableSlice& slice : PlaceModel(model, num_shards)) {
    ShardCheckpoint::Variable* v = shards[slice.shard].add_variables();
    v->set_name(slice.name);
    for (int64_t d : slice.shape) v->add_shape(d);
    std::vector<float> values(slice.count);
    std::iota(values.begin(), values.end(), static_cast<float>(slice.offset));
    v->set_values(values.data(), values.size() * sizeof(float));
  }
  return shards;
}

TEST(ModelArraysTest, JoinsTheSlicesOfEveryVariableInRowOrder) {
  const std::vector<VariableSpec> model = {
      {"dense_0/kernel", {300, 100}}, {"dense_0/bias", {100}}, {"tiny", {3, 2}}};
  for (int num_shards : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat(num_shards, " shard(s)"));
    const std::vector<ShardCheckpoint> shards = Checkpoints(model, num_shards);
    absl::StatusOr<std::vector<NpzArray>> arrays = ModelArrays(shards);
    ASSERT_TRUE(arrays.ok()) << arrays.status();
    ASSERT_EQ(arrays->size(), model.size());
    for (const VariableSpec& spec : model) {
      const NpzArray* a = Find(*arrays, spec.name);
      ASSERT_NE(a, nullptr) << spec.name;
      EXPECT_EQ(a->shape, spec.shape);
      std::vector<float> expected(spec.size());
      std::iota(expected.begin(), expected.end(), 0.0f);
      EXPECT_EQ(Floats(*a), expected) << spec.name;
    }
  }
}

TEST(ModelArraysTest, RefusesASliceMissing) {
  std::vector<ShardCheckpoint> shards = Checkpoints({{"w", {300, 100}}}, 3);
  ASSERT_EQ(shards[1].variables(0).name(), "w/part-1");
  shards[1].clear_variables();
  absl::StatusOr<std::vector<NpzArray>> arrays = ModelArrays(shards);
  EXPECT_EQ(arrays.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(arrays.status().message(), HasSubstr("part 1 is in no shard"));
}

TEST(TableArraysTest, SortsTheRowsAndAddsTheDenseFormWhereTheIdsAreFew) {
  const uint64_t seed = 11;
  const float scale = 0.5f;
  // ids 9, 2, 5: rows [id, -id]; the dense form's ids 0..9, 4 x 3 rows >= 10.
  const std::vector<NpzArray> arrays =
      TableArrays("emb", 2, seed, scale, {9, 2, 5}, {9, -9, 2, -2, 5, -5});
  ASSERT_EQ(arrays.size(), 3u);
  EXPECT_EQ(arrays[0].name, "emb.ids");
  EXPECT_THAT(Int64s(arrays[0]), ElementsAre(2, 5, 9));
  EXPECT_EQ(arrays[1].name, "emb.rows");
  EXPECT_EQ(arrays[1].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_THAT(Floats(arrays[1]), ElementsAre(2, -2, 5, -5, 9, -9));
  EXPECT_EQ(arrays[2].name, "emb");
  EXPECT_EQ(arrays[2].shape, (std::vector<int64_t>{10, 2}));
  const std::vector<float> dense = Floats(arrays[2]);
  for (int64_t id = 0; id < 10; ++id) {
    SCOPED_TRACE(id);
    std::vector<float> expected(2);
    if (id == 2 || id == 5 || id == 9) {
      expected = {static_cast<float>(id), static_cast<float>(-id)};
    } else {
      InitialRow(TableInitKey(seed, "emb"), id, scale, expected);
    }
    EXPECT_THAT(std::vector<float>(dense.begin() + id * 2, dense.begin() + id * 2 + 2),
                ElementsAre(expected[0], expected[1]));
  }
}

// A table of parts is exported as the tables it stands for: each part's
// columns under its own name, its untrained rows its own initial values.
TEST(ModelArraysTest, ExportsEachPartOfATableAsItsTable) {
  const uint64_t seed = 11;
  std::vector<ShardCheckpoint> shards(2);
  for (int s = 0; s < 2; ++s) {
    shards[s].set_shard(s);
    ShardCheckpoint::Embedding* e = shards[s].add_embeddings();
    e->set_seed(seed);
    e->set_num_shards(2);
    EmbeddingTableConfig* config = e->mutable_config();
    config->set_name("deep+wide");
    config->set_dim(3);
    for (const auto& [name, dim, scale] :
         {std::tuple<const char*, int, float>{"deep", 2, 0.5f}, {"wide", 1, 0.0f}}) {
      EmbeddingTablePart* part = config->add_parts();
      part->set_name(name);
      part->set_dim(dim);
      part->set_init_scale(scale);
    }
    // Shard s holds id 2 + s: rows [id, -id, 10 id].
    const uint64_t id = 2 + s;
    const float row[] = {float(id), -float(id), 10.0f * id};
    e->set_ids(&id, sizeof(id));
    e->set_values(row, sizeof(row));
  }
  absl::StatusOr<std::vector<NpzArray>> arrays = ModelArrays(shards);
  ASSERT_TRUE(arrays.ok()) << arrays.status();
  EXPECT_EQ(Find(*arrays, "deep+wide.ids"), nullptr);
  const NpzArray* deep = Find(*arrays, "deep.rows");
  const NpzArray* wide = Find(*arrays, "wide.rows");
  ASSERT_NE(deep, nullptr);
  ASSERT_NE(wide, nullptr);
  EXPECT_THAT(Int64s(*Find(*arrays, "deep.ids")), ElementsAre(2, 3));
  EXPECT_THAT(Int64s(*Find(*arrays, "wide.ids")), ElementsAre(2, 3));
  EXPECT_THAT(Floats(*deep), ElementsAre(2, -2, 3, -3));
  EXPECT_THAT(Floats(*wide), ElementsAre(20, 30));
  // The dense forms (ids 0..3): ids 0 and 1 as each table starts them.
  const std::vector<float> deep_dense = Floats(*Find(*arrays, "deep"));
  ASSERT_EQ(deep_dense.size(), 8u);
  std::vector<float> initial(2);
  InitialRow(TableInitKey(seed, "deep"), 1, 0.5f, initial);
  EXPECT_THAT(std::vector<float>(deep_dense.begin() + 2, deep_dense.begin() + 4),
              ElementsAre(initial[0], initial[1]));
  EXPECT_THAT(Floats(*Find(*arrays, "wide")), ElementsAre(0, 0, 20, 30));
}

TEST(TableArraysTest, NoDenseFormForIdsSpreadWideOrLarge) {
  const struct {
    const char* what;
    std::vector<uint64_t> ids;
    size_t arrays;
  } cases[] = {
      {"max id + 1 = 4 n", {0, 7}, 3},
      {"max id + 1 > 4 n", {0, 8}, 2},
      {"an id past 2^24", {uint64_t{1} << 24}, 2},
      {"an id past 2^63 (negative as int64)", {uint64_t{1} << 63, 1}, 2},
      {"no rows", {}, 2},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::vector<float> values(c.ids.size(), 1.0f);
    const std::vector<NpzArray> arrays = TableArrays("t", 1, 0, 0.1f, c.ids, values);
    EXPECT_EQ(arrays.size(), c.arrays);
    EXPECT_EQ(arrays[1].shape, (std::vector<int64_t>{static_cast<int64_t>(c.ids.size()), 1}));
  }
}

TEST(ReadShardCheckpointsTest, ReadsTheNewestOfEveryShard) {
  const std::string dir = absl::StrCat(ScratchDir(), "/two_shards");
  std::vector<ShardCheckpoint> shards = Checkpoints({{"w", {300, 100}}}, 2);
  for (int64_t version : {3, 5}) {
    for (ShardCheckpoint& s : shards) {
      s.set_version(version);
      ASSERT_TRUE(WriteCheckpoint(absl::StrCat(dir, "/shard-", s.shard()), s, 3).ok());
    }
  }
  absl::StatusOr<std::vector<ShardCheckpoint>> read = ReadShardCheckpoints(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[0].version(), 5);
  EXPECT_EQ((*read)[1].shard(), 1);
}

// Replica 0 lagged when the run ended (restarted, catching up): the backup
// that ended it as primary holds the final state; a replica folder of
// another run is no candidate, whatever its version.
TEST(ReadShardCheckpointsTest, TakesEachShardsFinalStateFromWhicheverReplicaHoldsIt) {
  const std::string dir = absl::StrCat(ScratchDir(), "/replicas");
  const auto write = [&](const std::string& folder, int shard, int64_t version, bool finished,
                         const std::string& run) {
    ShardCheckpoint c;
    c.set_shard(shard);
    c.set_version(version);
    c.set_finished(finished);
    c.set_run_id(run);
    ASSERT_TRUE(WriteCheckpoint(absl::StrCat(dir, folder, "/shard-", shard), c, 3).ok());
  };
  write("", 0, 60, false, "run");            // replica 0 before it was killed
  write("", 0, 120, true, "run");            // ... and once back, still behind at the end
  write("/replica-1", 0, 175, true, "run");  // the backup that took over
  write("/replica-1", 1, 175, true, "run");  // shard 1's backup, as its primary
  write("", 1, 175, true, "run");
  write("/replica-2", 0, 900, true, "old");  // a third replica's folders of an earlier run
  write("/replica-2", 1, 900, true, "old");

  absl::StatusOr<std::vector<ShardCheckpoint>> read = ReadShardCheckpoints(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[0].version(), 175);
  EXPECT_EQ((*read)[1].version(), 175);
  EXPECT_TRUE((*read)[1].finished());

  // With no replica 0 folder at all (it never wrote one), the backups' still
  // do: the newest of them is the run's.
  std::filesystem::remove_all(absl::StrCat(dir, "/shard-0"));
  std::filesystem::remove_all(absl::StrCat(dir, "/replica-2"));
  read = ReadShardCheckpoints(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)[0].version(), 175);
}

// A primary killed before its backup held its last version left that
// version's checkpoint; the backup, which took over at a higher epoch,
// made the version again: that one is the run's, in whichever folder.
TEST(ReadShardCheckpointsTest, OfOneVersionTakesTheLaterEpochs) {
  for (const bool later_in_replica_zero : {false, true}) {
    SCOPED_TRACE(later_in_replica_zero ? "the later in replica 0's folder" : "in the backup's");
    const std::string dir =
        absl::StrCat(ScratchDir(), "/epochs", later_in_replica_zero ? "_zero" : "_backup");
    const auto write = [&](const std::string& folder, int64_t epoch) {
      ShardCheckpoint c;
      c.set_shard(0);
      c.set_version(40);
      c.set_epoch(epoch);
      c.set_run_id("run");
      ASSERT_TRUE(WriteCheckpoint(absl::StrCat(dir, folder, "/shard-0"), c, 3).ok());
    };
    write("", later_in_replica_zero ? 3 : 1);
    write("/replica-1", 2);
    absl::StatusOr<std::vector<ShardCheckpoint>> read = ReadShardCheckpoints(dir);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_EQ(read->size(), 1u);
    EXPECT_EQ((*read)[0].version(), 40);
    EXPECT_EQ((*read)[0].epoch(), later_in_replica_zero ? 3 : 2);
  }
}

TEST(ReadShardCheckpointsTest, RefusesWhatIsNotEveryShardOfOneRun) {
  const std::string root = absl::StrCat(ScratchDir(), "/refused");
  const auto write = [&](const std::string& dir, int shard, const std::string& run) {
    ShardCheckpoint c;
    c.set_shard(shard);
    c.set_run_id(run);
    ASSERT_TRUE(WriteCheckpoint(absl::StrCat(root, "/", dir, "/shard-", shard), c, 3).ok());
  };
  write("gap", 0, "");
  write("gap", 2, "");
  write("mixed", 0, "a");
  write("mixed", 1, "b");
  write("table", 0, "");
  {
    ShardCheckpoint c;
    ShardCheckpoint::Embedding* e = c.add_embeddings();
    e->mutable_config()->set_name("emb");
    e->set_num_shards(2);
    ASSERT_TRUE(WriteCheckpoint(absl::StrCat(root, "/table/shard-0"), c, 3).ok());
  }
  std::filesystem::create_directories(absl::StrCat(root, "/empty"));
  std::filesystem::create_directories(absl::StrCat(root, "/no_file/shard-0"));
  const struct {
    std::string dir;
    std::string message;
  } cases[] = {
      {"empty", "no checkpoint in"},
      {"absent", "no checkpoint in"},
      {"no_file", "shard 0 has no valid checkpoint"},
      {"gap", "shard 1 has no valid checkpoint"},
      {"mixed", "different runs"},
      {"table", "placed over 2 shards"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.dir);
    absl::StatusOr<std::vector<ShardCheckpoint>> read =
        ReadShardCheckpoints(absl::StrCat(root, "/", c.dir));
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(), HasSubstr(c.message));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
