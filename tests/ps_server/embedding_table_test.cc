// The Table contract (ps_server/table.h) as the embedding tables keep it:
// rows created by training only, with initial values every shard and
// restart agrees on; pushes checked before anything changes; updates all
// or nothing; the SYNC step's rank-ordered mean, bitwise the same in any
// arrival order; row-wise optimizers against hand-computed values; the row
// limit; checkpoints that round-trip and refuse what does not fit; pulls.
#include "ps_server/embedding_table.h"

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
#include "ps_server/embedding_init.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 7;

OptimizerConfig Sgd(float lr, float momentum = 0) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(lr);
  config.mutable_sgd()->set_momentum(momentum);
  return config;
}

OptimizerConfig Adagrad(float lr, float initial_accumulator) {
  OptimizerConfig config;
  config.mutable_adagrad()->set_learning_rate(lr);
  config.mutable_adagrad()->set_initial_accumulator(initial_accumulator);
  return config;
}

OptimizerConfig Adam(float lr) {
  OptimizerConfig config;
  config.mutable_adam()->set_learning_rate(lr);
  return config;
}

OptimizerConfig Ftrl(float alpha, float beta, float l1, float l2, float initial_accumulator = 0) {
  OptimizerConfig config;
  config.mutable_ftrl()->set_initial_accumulator(initial_accumulator);
  config.mutable_ftrl()->set_learning_rate(alpha);
  config.mutable_ftrl()->set_beta(beta);
  config.mutable_ftrl()->set_l1(l1);
  config.mutable_ftrl()->set_l2(l2);
  return config;
}

EmbeddingTableConfig Spec(const std::string& name, int dim,
                          std::optional<OptimizerConfig> optimizer = std::nullopt,
                          int64_t max_rows = 0, std::optional<float> init_scale = 0.0f) {
  EmbeddingTableConfig spec;
  spec.set_name(name);
  spec.set_dim(dim);
  if (optimizer) *spec.mutable_optimizer() = *optimizer;
  spec.set_max_rows_per_shard(max_rows);
  if (init_scale) spec.set_init_scale(*init_scale);
  return spec;
}

EmbeddingTableOptions Options(int shard = 0, int num_shards = 1, int workers = 1,
                              uint64_t seed = kSeed) {
  EmbeddingTableOptions options;
  options.shard = shard;
  options.num_shards = num_shards;
  options.num_workers = workers;
  options.seed = seed;
  options.optimizer = Sgd(0.5f);  // the job's
  return options;
}

std::unique_ptr<EmbeddingTable> Make(const std::vector<EmbeddingTableConfig>& specs,
                                     EmbeddingTableOptions options = Options()) {
  auto table = std::make_unique<EmbeddingTable>(std::move(options));
  InitRequest init;
  for (const EmbeddingTableConfig& spec : specs) *init.add_embeddings() = spec;
  EXPECT_TRUE(table->Initialize(init).ok());
  return table;
}

std::string IdBytes(const std::vector<uint64_t>& ids) {
  std::string bytes(ids.size() * sizeof(uint64_t), '\0');
  if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
  return bytes;
}

EmbeddingRows Rows(const std::string& table, const std::vector<uint64_t>& ids,
                   const std::vector<float>& gradients, DType dtype = FLOAT32) {
  EmbeddingRows rows;
  rows.set_table(table);
  rows.set_ids(IdBytes(ids));
  rows.set_dtype(dtype);
  EncodeValues(gradients, dtype, rows.mutable_data());
  return rows;
}

PushRequest Push(std::vector<EmbeddingRows> parts, int worker = 0) {
  PushRequest push;
  push.set_worker(worker);
  for (EmbeddingRows& part : parts) *push.add_rows() = std::move(part);
  return push;
}

// An ASYNC update: checked, staged, committed (or discarded on failure).
absl::Status Apply(EmbeddingTable& table, const PushRequest& push, float lr_scale = 1.0f) {
  TablePush plan;
  if (absl::Status s = table.CheckPush(push, false, true, &plan); !s.ok()) return s;
  if (absl::Status s = table.Stage(push, plan, lr_scale); !s.ok()) {
    table.Discard();
    return s;
  }
  table.Commit();
  return absl::OkStatus();
}

std::vector<float> Lookup(const EmbeddingTable& table, const std::string& name,
                          const std::vector<uint64_t>& ids) {
  std::vector<float> out(ids.size() * table.dim(name));
  EXPECT_TRUE(table.Lookup(name, ids, out).ok());
  return out;
}

ShardCheckpoint Exported(const EmbeddingTable& table) {
  ShardCheckpoint checkpoint;
  table.Export(&checkpoint);
  return checkpoint;
}

std::string Snapshot(const EmbeddingTable& table) { return Exported(table).SerializeAsString(); }

EmbeddingTableStats StatsOf(const EmbeddingTable& table, const std::string& name) {
  StatsResponse stats;
  table.AddStats(&stats);
  for (const EmbeddingTableStats& s : stats.embeddings()) {
    if (s.table() == name) return s;
  }
  ADD_FAILURE() << "no stats for " << name;
  return {};
}

// The first `count` ids of shard `shard` of `num_shards`, from `from` on.
std::vector<uint64_t> IdsOfShard(int shard, int num_shards, int count, uint64_t from = 0) {
  std::vector<uint64_t> ids;
  for (uint64_t id = from; static_cast<int>(ids.size()) < count; ++id) {
    if (ShardOfRow(id, num_shards) == shard) ids.push_back(id);
  }
  return ids;
}

// --- Specs and initialization ---

TEST(EmbeddingConfigTest, SpecsResolveToTheirDocumentedDefaults) {
  absl::StatusOr<EmbeddingTableConfig> plain =
      ResolveEmbeddingTable(Spec("a", 16, {}, 0, {}), Sgd(0.5f));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->optimizer().sgd().learning_rate(), 0.5f);  // the job's
  EXPECT_EQ(plain->max_rows_per_shard(), kDefaultMaxRowsPerShard);
  EXPECT_EQ(plain->init_scale(), 0.25f);  // 1/sqrt(16)
  absl::StatusOr<EmbeddingTableConfig> ftrl =
      ResolveEmbeddingTable(Spec("w", 1, Ftrl(0.1f, 0, 0, 0), 10, {}), Sgd(0.5f));
  ASSERT_TRUE(ftrl.ok()) << ftrl.status();
  EXPECT_TRUE(ftrl->optimizer().has_ftrl());
  EXPECT_EQ(ftrl->optimizer().ftrl().beta(), 0.0f);  // stored as given, resolved when built
  EXPECT_EQ(ftrl->max_rows_per_shard(), 10);
  EXPECT_EQ(ftrl->init_scale(), 0.0f);
}

TEST(EmbeddingTableTest, InitializeRefusesAMalformedSpecAndStaysEmpty) {
  struct Case {
    const char* name;
    std::vector<EmbeddingTableConfig> specs;
    const char* message;
  };
  OptimizerConfig no_rate;
  no_rate.mutable_adam();
  const Case cases[] = {
      {"no name", {Spec("", 4)}, "no name"},
      {"dim 0", {Spec("a", 0)}, "dim"},
      {"dim too large", {Spec("a", kMaxEmbeddingDim + 1)}, "dim"},
      {"negative row limit", {Spec("a", 4, {}, -1)}, "max_rows_per_shard"},
      {"row limit over 32 bits", {Spec("a", 4, {}, kMaxRowsPerShard + 1)}, "max_rows_per_shard"},
      {"negative init scale", {Spec("a", 4, {}, 0, -1.0f)}, "init_scale"},
      {"NaN init scale", {Spec("a", 4, {}, 0, std::nanf(""))}, "init_scale"},
      {"optimizer without a rate", {Spec("a", 4, no_rate)}, "learning_rate"},
      {"negative FTRL l1", {Spec("a", 4, Ftrl(0.1f, 1, -1, 0))}, "ftrl"},
      {"declared twice", {Spec("a", 4), Spec("a", 8)}, "declared twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EmbeddingTable table(Options());
    InitRequest init;
    for (const EmbeddingTableConfig& spec : c.specs) *init.add_embeddings() = spec;
    absl::Status status = table.Initialize(init);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_FALSE(table.initialized());
    EXPECT_EQ(Exported(table).embeddings_size(), 0);
  }
}

TEST(EmbeddingTableTest, AModelWithoutEmbeddingsInitializesAnEmptyTable) {
  EmbeddingTable table(Options());
  ASSERT_TRUE(table.Initialize(InitRequest()).ok());
  EXPECT_TRUE(table.initialized());
  EXPECT_EQ(table.parameter_bytes(), 0);
  StatsResponse stats;
  table.AddStats(&stats);
  EXPECT_EQ(stats.embeddings_size(), 0);
}

// --- Initial values ---

TEST(EmbeddingTableTest, AnUnseenRowReadsAsItsDocumentedInitialValueAndIsNotStored) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("user", 4, {}, 0, 0.5f)});
  // The formula of ps_server/embedding_init.h for seed 7, "user", id 42,
  // scale 0.5, computed apart from this code: a change to it fails here.
  EXPECT_EQ(Lookup(*table, "user", {42}),
            (std::vector<float>{-0.39397627115249634f, -0.23702973127365112f, 0.23413687944412231f,
                                -0.30019330978393555f}));
  // Reading a million ids stores nothing.
  std::vector<uint64_t> ids(1 << 20);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 7919;
  std::vector<float> values = Lookup(*table, "user", ids);
  EXPECT_EQ(StatsOf(*table, "user").rows(), 0);
  EXPECT_EQ(StatsOf(*table, "user").bytes(), 0);
  EXPECT_EQ(table->parameter_bytes(), 0);
  // Uniform in [-0.5, 0.5): bounds and mean.
  double sum = 0;
  for (float v : values) {
    ASSERT_GE(v, -0.5f);
    ASSERT_LT(v, 0.5f);
    sum += v;
  }
  EXPECT_NEAR(sum / values.size(), 0.0, 1e-3);
  EXPECT_LT(*std::min_element(values.begin(), values.end()), -0.49f);
  EXPECT_GT(*std::max_element(values.begin(), values.end()), 0.49f);
}

TEST(EmbeddingTableTest, InitialValuesAgreeAcrossShardsAndDependOnSeedTableAndId) {
  const std::vector<uint64_t> zero = IdsOfShard(0, 2, 3), one = IdsOfShard(1, 2, 3);
  std::unique_ptr<EmbeddingTable> shard0 = Make({Spec("a", 8, {}, 0, 1.0f)}, Options(0, 2));
  std::unique_ptr<EmbeddingTable> shard1 = Make({Spec("a", 8, {}, 0, 1.0f)}, Options(1, 2));
  std::unique_ptr<EmbeddingTable> alone =
      Make({Spec("a", 8, {}, 0, 1.0f), Spec("b", 8, {}, 0, 1.0f)});
  std::unique_ptr<EmbeddingTable> reseeded =
      Make({Spec("a", 8, {}, 0, 1.0f)}, Options(0, 1, 1, kSeed + 1));
  EXPECT_EQ(Lookup(*shard0, "a", zero), Lookup(*alone, "a", zero));
  EXPECT_EQ(Lookup(*shard1, "a", one), Lookup(*alone, "a", one));
  EXPECT_NE(Lookup(*alone, "a", zero), Lookup(*alone, "b", zero));
  EXPECT_NE(Lookup(*alone, "a", zero), Lookup(*reseeded, "a", zero));
  EXPECT_NE(Lookup(*alone, "a", {zero[0]}), Lookup(*alone, "a", {zero[1]}));
}

TEST(EmbeddingTableTest, UnsetInitScaleIsOneOverRootDimAndZeroUnderFtrl) {
  std::unique_ptr<EmbeddingTable> table =
      Make({Spec("a", 4, {}, 0, {}), Spec("w", 4, Ftrl(0.1f, 1, 0, 0), 0, {})});
  std::vector<uint64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> a = Lookup(*table, "a", ids);
  EXPECT_LT(*std::max_element(a.begin(), a.end()), 0.5f);
  EXPECT_GT(*std::max_element(a.begin(), a.end()), 0.49f);
  std::vector<float> w = Lookup(*table, "w", ids);
  EXPECT_TRUE(
      std::all_of(w.begin(), w.end(), [](float v) { return std::signbit(v) == 0 && v == 0; }));
}

// --- Pushes: checks ---

TEST(EmbeddingTableTest, ABadPushIsRefusedNamingTableAndIdAndChangesNothing) {
  const std::vector<uint64_t> mine = IdsOfShard(0, 2, 2), theirs = IdsOfShard(1, 2, 1);
  struct Case {
    const char* name;
    PushRequest push;
    bool check_finite;
    std::vector<std::string> message;
  };
  EmbeddingRows ragged = Rows("a", mine, {1, 2, 3, 4});
  ragged.mutable_ids()->pop_back();
  EmbeddingRows bad_dtype = Rows("a", mine, {1, 2, 3, 4});
  bad_dtype.set_dtype(static_cast<DType>(9));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {"unknown table", Push({Rows("zz", mine, {1, 2, 3, 4})}), true, {"\"zz\"", "no such table"}},
      {"table twice",
       Push({Rows("a", {mine[0]}, {1, 2}), Rows("a", {mine[1]}, {1, 2})}),
       true,
       {"\"a\"", "twice"}},
      {"ids not whole", Push({ragged}), true, {"\"a\"", "multiple of 8"}},
      {"another shard's id",
       Push({Rows("a", {mine[0], theirs[0]}, {1, 2, 3, 4})}),
       true,
       {"\"a\"", absl::StrCat("id ", theirs[0]), "shard 1 of 2"}},
      {"duplicate id",
       Push({Rows("a", {mine[1], mine[1]}, {1, 2, 3, 4})}),
       true,
       {"\"a\"", absl::StrCat("id ", mine[1], " appears twice")}},
      {"row too narrow", Push({Rows("a", mine, {1, 2, 3})}), true, {"\"a\"", "dim 2"}},
      {"row too wide", Push({Rows("a", mine, {1, 2, 3, 4, 5, 6})}), true, {"\"a\"", "dim 2"}},
      {"unknown dtype", Push({bad_dtype}), true, {"\"a\"", "dtype"}},
      {"NaN row",
       Push({Rows("a", mine, {1, 2, nan, 4})}),
       true,
       {"\"a\"", absl::StrCat("id ", mine[1]), "non-finite"}},
      {"Inf in a float16 row",
       Push({Rows("a", mine, {inf, 2, 3, 4}, FLOAT16)}),
       true,
       {"\"a\"", absl::StrCat("id ", mine[0]), "non-finite"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 2)}, Options(0, 2));
    ASSERT_TRUE(Apply(*table, Push({Rows("a", {mine[0]}, {1, 1})})).ok());
    const std::string before = Snapshot(*table);
    TablePush plan;
    absl::Status status = table->CheckPush(c.push, true, c.check_finite, &plan);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& part : c.message) EXPECT_THAT(status.message(), HasSubstr(part));
    EXPECT_EQ(Snapshot(*table), before);
  }
}

TEST(EmbeddingTableTest, APushMayCarryAnyTablesAndTheSameIdInDifferentTables) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1), Spec("b", 1), Spec("c", 1)});
  PushRequest push = Push({Rows("c", {5}, {1}), Rows("a", {5}, {2})});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, /*require_all=*/true, true, &plan).ok());
  EXPECT_EQ(plan.indices, (std::vector<int>{2, 0}));
  EXPECT_TRUE(table->CheckPush(Push({}), true, true, &plan).ok());
  EXPECT_TRUE(plan.indices.empty());
}

// --- ASYNC updates ---

TEST(EmbeddingTableTest, StagedRowsAppearOnlyAtCommitAndDiscardLeavesNoTrace) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 2, Sgd(0.5f), 0, 1.0f)});
  const std::vector<float> initial = Lookup(*table, "a", {3, 4});
  const PushRequest push = Push({Rows("a", {3, 4}, {2, 4, -2, 0})});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, false, true, &plan).ok());
  ASSERT_TRUE(table->Stage(push, plan, 1.0f).ok());
  EXPECT_EQ(Lookup(*table, "a", {3, 4}), initial);
  EXPECT_EQ(StatsOf(*table, "a").rows(), 0);
  table->Discard();
  EXPECT_EQ(Lookup(*table, "a", {3, 4}), initial);
  EXPECT_EQ(StatsOf(*table, "a").rows_admitted(), 0);
  table->Commit();  // nothing staged: nothing changes
  EXPECT_EQ(StatsOf(*table, "a").rows(), 0);
  EXPECT_EQ(Exported(*table).embeddings(0).updates(), 0);

  ASSERT_TRUE(table->Stage(push, plan, 1.0f).ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "a", {3, 4}),
            (std::vector<float>{initial[0] - 1, initial[1] - 2, initial[2] + 1, initial[3]}));
  EXPECT_EQ(StatsOf(*table, "a").rows(), 2);
  EXPECT_EQ(StatsOf(*table, "a").rows_admitted(), 2);
  EXPECT_EQ(table->parameter_bytes(), 2 * 2 * int64_t{sizeof(float)});
}

TEST(EmbeddingTableTest, LrScaleScalesTheStep) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(0.5f))});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1}, {4})}), 0.25f).ok());
  EXPECT_EQ(Lookup(*table, "a", {1}), std::vector<float>{-0.5f});
}

TEST(EmbeddingTableTest, AnUpdateThatWouldNotBeFiniteIsRefusedNamingTheRow) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(10.0f))});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1}, {1})})).ok());
  const std::string before = Snapshot(*table);
  absl::Status status = Apply(*table, Push({Rows("a", {2, 1}, {1, 3e38f})}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"a\""));
  EXPECT_THAT(status.message(), HasSubstr("id 1 "));
  EXPECT_EQ(Snapshot(*table), before);  // row 2 was staged, then discarded
}

TEST(EmbeddingTableTest, SixteenBitGradientsApplyAsTheirDecodedValues) {
  for (DType dtype : {FLOAT16, BFLOAT16}) {
    SCOPED_TRACE(DType_Name(dtype));
    const std::vector<float> gradient = {0.1f, -3.3f, 1000.7f};
    std::vector<float> decoded(gradient.size());
    std::string wire;
    EncodeValues(gradient, dtype, &wire);
    DecodeValues(wire, dtype, decoded);
    ASSERT_NE(decoded, gradient);  // the type does round
    std::unique_ptr<EmbeddingTable> narrow = Make({Spec("a", 3, Sgd(0.5f), 0, 1.0f)});
    std::unique_ptr<EmbeddingTable> wide = Make({Spec("a", 3, Sgd(0.5f), 0, 1.0f)});
    ASSERT_TRUE(Apply(*narrow, Push({Rows("a", {9}, gradient, dtype)})).ok());
    ASSERT_TRUE(Apply(*wide, Push({Rows("a", {9}, decoded)})).ok());
    EXPECT_EQ(Lookup(*narrow, "a", {9}), Lookup(*wide, "a", {9}));
  }
}

// --- Row-wise optimizers, against values worked by hand ---

TEST(EmbeddingTableTest, RowWiseOptimizersMatchHandComputedSteps) {
  struct Case {
    const char* name;
    OptimizerConfig optimizer;
    std::vector<float> gradients;  // one per update of a row starting at 0
    std::vector<float> expected;   // the row after each update
  };
  const Case cases[] = {
      // w -= 0.5 g
      {"sgd", Sgd(0.5f), {2, 2}, {-1, -2}},
      // v = 0.5 v + g; w -= 0.5 v:  v = 2, 3
      {"momentum", Sgd(0.5f, 0.5f), {2, 2}, {-1, -2.5f}},
      // acc = 7 + 9 = 16, w = -3/4; acc = 25, w = -0.75 + 3/5
      {"adagrad", Adagrad(1.0f, 7.0f), {3, -3}, {-0.75f, -0.15f}},
      // A constant gradient: the bias-corrected step is lr each time.
      {"adam", Adam(0.1f), {3, 3, 3}, {-0.1f, -0.2f, -0.3f}},
      // alpha 1, beta 1: n = 9, sigma = 3, z = 3, w = -3 / (1 + 3);
      // n = 25, sigma = 2, z = 3 + 4 + 2 * 0.75 = 8.5, w = -8.5 / 6
      {"ftrl", Ftrl(1, 1, 0, 0), {3, 4}, {-0.75f, -8.5f / 6}},
      // l1 = 4: |z| = 3 <= 4, w = 0 exactly; z = 7, w = -(7 - 4) / 6
      {"ftrl l1", Ftrl(1, 1, 4, 0), {3, 4}, {0, -0.5f}},
      // l2 = 2: w = -(7 - 4) / (6 + 2)
      {"ftrl l1 l2", Ftrl(1, 1, 4, 2), {3, 4}, {0, -0.375f}},
      // Negative z: w = -(z + l1) / ...:  z = -3 -> 0;  z = -7 -> +0.5
      {"ftrl l1 negative", Ftrl(1, 1, 4, 0), {-3, -4}, {0, 0.5f}},
      // n starts at 16: n = 25, sigma = 5 - 4, z = 3, w = -3 / (1 + 5);
      // n = 26, sigma = sqrt(26) - 5, z = 3 + 1 + sigma * 0.5
      {"ftrl initial accumulator",
       Ftrl(1, 1, 0, 0, 16),
       {3, 1},
       {-0.5f, -(4 + (std::sqrt(26.0f) - 5) * 0.5f) / (1 + std::sqrt(26.0f))}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, c.optimizer)});
    for (size_t step = 0; step < c.gradients.size(); ++step) {
      ASSERT_TRUE(Apply(*table, Push({Rows("a", {11}, {c.gradients[step]})})).ok());
      const float value = Lookup(*table, "a", {11})[0];
      EXPECT_NEAR(value, c.expected[step], 1e-6f) << "after update " << step + 1;
      if (c.expected[step] == 0) {
        EXPECT_EQ(std::bit_cast<uint32_t>(value), 0u) << "not +0";
      }
    }
  }
}

TEST(EmbeddingTableTest, FtrlWithL1KeepsRowsExactlyZeroUntilTheirSignalExceedsIt) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("w", 4, Ftrl(0.1f, 1, 1.0f, 0.1f))});
  std::vector<uint64_t> ids(100);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + i;
  // Small alternating gradients: z stays within l1 for every weight.
  for (int step = 0; step < 20; ++step) {
    std::vector<float> g(ids.size() * 4);
    for (size_t i = 0; i < g.size(); ++i) g[i] = ((i + step) % 2 ? 0.3f : -0.3f);
    ASSERT_TRUE(Apply(*table, Push({Rows("w", ids, g)})).ok());
  }
  EXPECT_EQ(StatsOf(*table, "w").rows(), 100);
  const ShardCheckpoint checkpoint = Exported(*table);
  const std::string& values = checkpoint.embeddings(0).values();
  EXPECT_EQ(values, std::string(values.size(), '\0'));
  // A steady signal crosses l1 and the weight leaves zero, against it.
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(Apply(*table, Push({Rows("w", {1000}, {1, 1, 1, 1})})).ok());
  }
  for (float w : Lookup(*table, "w", {1000})) EXPECT_LT(w, 0.0f);
  for (float w : Lookup(*table, "w", {1001})) EXPECT_EQ(w, 0.0f);
}

TEST(EmbeddingTableTest, AdamIsLazyOnlyTouchedRowsAdvanceTheirMomentsAndStep) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Adam(0.1f))});
  // Row 1 every update; row 2 at the first and third.
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1, 2}, {3, 3})})).ok());
  const ShardCheckpoint after_one = Exported(*table);
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1}, {3})})).ok());
  const ShardCheckpoint after_two = Exported(*table);
  // Row 2's values, moments and step did not move.
  auto row_bytes = [](const std::string& bytes, int row, size_t width) {
    return bytes.substr(row * width, width);
  };
  EXPECT_EQ(row_bytes(after_two.embeddings(0).slots(), 1, 8),
            row_bytes(after_one.embeddings(0).slots(), 1, 8));
  EXPECT_EQ(row_bytes(after_two.embeddings(0).values(), 1, 4),
            row_bytes(after_one.embeddings(0).values(), 1, 4));
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1, 2}, {3, 3})})).ok());
  // Row 2's second update is its step 2: with a constant gradient the
  // bias-corrected step is lr again (the table's step 3 would give
  // m / (1 - 0.9^3) = 0.19 g / 0.271: a step of 0.7 lr).
  const std::vector<float> rows = Lookup(*table, "a", {1, 2});
  EXPECT_NEAR(rows[0], -0.3f, 1e-6f);
  EXPECT_NEAR(rows[1], -0.2f, 1e-6f);
  const ShardCheckpoint checkpoint = Exported(*table);
  std::vector<int64_t> updates(2);
  std::memcpy(updates.data(), checkpoint.embeddings(0).row_updates().data(), 16);
  EXPECT_EQ(updates, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(checkpoint.embeddings(0).updates(), 3);
}

TEST(EmbeddingTableTest, LearningRateDecayCountsTheTablesUpdates) {
  OptimizerConfig decayed = Sgd(1.0f);
  decayed.set_decay_rate(0.5f);
  decayed.set_decay_steps(1);
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, decayed), Spec("b", 1, decayed)});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1}, {1})})).ok());  // a's update 1: lr / 2
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {2}, {1})})).ok());  // a's update 2: lr / 4
  ASSERT_TRUE(Apply(*table, Push({Rows("b", {2}, {1})})).ok());  // b's update 1: lr / 2
  EXPECT_EQ(Lookup(*table, "a", {1, 2}), (std::vector<float>{-0.5f, -0.25f}));
  EXPECT_EQ(Lookup(*table, "b", {2}), std::vector<float>{-0.5f});
}

TEST(EmbeddingTableTest, EachTableTrainsWithItsOwnOptimizerOrTheJobs) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("job", 1), Spec("own", 1, Sgd(0.125f))});
  ASSERT_TRUE(Apply(*table, Push({Rows("job", {1}, {1}), Rows("own", {1}, {1})})).ok());
  EXPECT_EQ(Lookup(*table, "job", {1}), std::vector<float>{-0.5f});  // Options(): sgd 0.5
  EXPECT_EQ(Lookup(*table, "own", {1}), std::vector<float>{-0.125f});
}

// --- The SYNC step ---

// Values whose float sums depend on the order of the additions: id 1's
// first element sums to 1 in rank order, to 0 in some others.
std::vector<PushRequest> StepPushes() {
  return {
      Push({Rows("a", {1, 2}, {1e8f, 1, 0.1f, 3})}, 0),
      Push({Rows("a", {2, 3, 1}, {0.7f, -1, 5, 5, -1e8f, 0.25f}), Rows("b", {1}, {2})}, 1),
      Push({Rows("a", {1, 3}, {1, 1e-3f, 0.3f, 1e7f})}, 2),
  };
}

TEST(EmbeddingTableTest, TheSyncStepAppliesTheRankOrderedMeanOnce) {
  std::unique_ptr<EmbeddingTable> table =
      Make({Spec("a", 2, Sgd(1.0f)), Spec("b", 1, Sgd(1.0f))}, Options(0, 1, 3));
  const std::vector<PushRequest> pushes = StepPushes();
  for (int rank = 0; rank < 3; ++rank) {
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
    table->Land(rank, pushes[rank], plan);
  }
  ASSERT_TRUE(table->StageStep().ok());
  EXPECT_EQ(StatsOf(*table, "a").rows(), 0);  // staged, not committed
  table->Commit();
  // Per id: (0 + g_0 + g_1 + g_2) * (1/3), ranks without the id adding nothing.
  const float third = 1.0f / 3.0f;
  auto mean = [third](float a, float b, float c = 0) { return (0.0f + a + b + c) * third; };
  ASSERT_EQ(-mean(1e8f, -1e8f, 1), -third);
  EXPECT_EQ(Lookup(*table, "a", {1, 2, 3}),
            (std::vector<float>{-mean(1e8f, -1e8f, 1), -mean(1, 0.25f, 1e-3f), -mean(0.1f, 0.7f),
                                -mean(3, -1), -mean(5, 0.3f), -mean(5, 1e7f)}));
  EXPECT_EQ(Lookup(*table, "b", {1}), std::vector<float>{-(0.0f + 2) * third});
  EXPECT_EQ(Exported(*table).embeddings(0).updates(), 1);
  // The step is empty again: a step with one rank divides by one.
  TablePush plan;
  const PushRequest one = Push({Rows("b", {1}, {3})});
  ASSERT_TRUE(table->CheckPush(one, true, true, &plan).ok());
  table->Land(0, one, plan);
  ASSERT_TRUE(table->StageStep().ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "b", {1}), std::vector<float>{-(0.0f + 2) * third - 3});
}

TEST(EmbeddingTableTest, TheSyncStepIsBitwiseTheSameInEveryArrivalOrder) {
  const std::vector<PushRequest> pushes = StepPushes();
  std::string reference;
  std::vector<int> order = {0, 1, 2};
  do {
    SCOPED_TRACE(testing::Message() << order[0] << order[1] << order[2]);
    std::unique_ptr<EmbeddingTable> table =
        Make({Spec("a", 2, Adam(0.01f), 0, 1.0f), Spec("b", 1, Adam(0.01f))}, Options(0, 1, 3));
    for (int rank : order) {
      TablePush plan;
      ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
      table->Land(rank, pushes[rank], plan);
    }
    ASSERT_TRUE(table->StageStep().ok());
    table->Commit();
    if (reference.empty()) reference = Snapshot(*table);
    EXPECT_EQ(Snapshot(*table), reference);
  } while (std::next_permutation(order.begin(), order.end()));

  // And with the ranks landing at once on their own threads.
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<EmbeddingTable> table =
        Make({Spec("a", 2, Adam(0.01f), 0, 1.0f), Spec("b", 1, Adam(0.01f))}, Options(0, 1, 3));
    std::vector<TablePush> plans(3);
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plans[rank]).ok());
    }
    std::latch start(3);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 3; ++rank) {
      ranks.emplace_back([&, rank] {
        start.arrive_and_wait();
        table->Land(rank, pushes[rank], plans[rank]);
      });
    }
    for (std::thread& t : ranks) t.join();
    ASSERT_TRUE(table->StageStep().ok());
    table->Commit();
    EXPECT_EQ(Snapshot(*table), reference);
  }
}

TEST(EmbeddingTableTest, TheSyncMeanDividesByTheRanksThatLanded) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(1.0f))}, Options(0, 1, 4));
  for (int rank : {3, 1}) {
    const PushRequest push = Push({Rows("a", {1}, {static_cast<float>(rank)})}, rank);
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
    table->Land(rank, push, plan);
  }
  // A landed rank with no rows still counts.
  const PushRequest empty = Push({}, 0);
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(empty, true, true, &plan).ok());
  table->Land(0, empty, plan);
  ASSERT_TRUE(table->StageStep().ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "a", {1}), std::vector<float>{-(0.0f + 1 + 3) * (1.0f / 3)});
}

TEST(EmbeddingTableTest, AFailedSyncStepIsEmptiedAndDiscardable) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(10.0f))}, Options(0, 1, 2));
  const std::string before = Snapshot(*table);
  for (int rank = 0; rank < 2; ++rank) {
    const PushRequest push = Push({Rows("a", {1, 2}, {1, 3e38f})}, rank);
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
    table->Land(rank, push, plan);
  }
  absl::Status status = table->StageStep();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("id 2 "));
  table->Discard();
  EXPECT_EQ(Snapshot(*table), before);
  // The next step starts empty.
  ASSERT_TRUE(table->StageStep().ok());
  table->Commit();
  EXPECT_EQ(Snapshot(*table), before);
}

// --- The row limit ---

TEST(EmbeddingTableTest, PastTheRowLimitNewRowsAreRefusedAndCountedWhileOldOnesTrain) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(1.0f), 3)});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {10, 11, 12, 13, 14}, {1, 1, 1, 1, 1})})).ok());
  EXPECT_EQ(Lookup(*table, "a", {10, 11, 12, 13, 14}), (std::vector<float>{-1, -1, -1, 0, 0}));
  EmbeddingTableStats stats = StatsOf(*table, "a");
  EXPECT_EQ(stats.rows(), 3);
  EXPECT_EQ(stats.rows_admitted(), 3);
  EXPECT_EQ(stats.rows_refused(), 2);

  // A discarded update counts nothing.
  const PushRequest push = Push({Rows("a", {15, 10}, {1, 1})});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, false, true, &plan).ok());
  ASSERT_TRUE(table->Stage(push, plan, 1.0f).ok());
  table->Discard();
  EXPECT_EQ(StatsOf(*table, "a").rows_refused(), 2);

  ASSERT_TRUE(Apply(*table, push).ok());
  EXPECT_EQ(Lookup(*table, "a", {10, 15}), (std::vector<float>{-2, 0}));
  stats = StatsOf(*table, "a");
  EXPECT_EQ(stats.rows(), 3);
  EXPECT_EQ(stats.rows_admitted(), 3);
  EXPECT_EQ(stats.rows_refused(), 3);
}

TEST(EmbeddingTableTest, TheSyncStepAdmitsRowsInRankOrderUpToTheLimit) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(1.0f), 2)}, Options(0, 1, 2));
  const PushRequest pushes[] = {Push({Rows("a", {7, 5}, {2, 2})}, 0),
                                Push({Rows("a", {9, 7}, {2, 2})}, 1)};
  for (int rank : {1, 0}) {
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
    table->Land(rank, pushes[rank], plan);
  }
  ASSERT_TRUE(table->StageStep().ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "a", {7, 5, 9}), (std::vector<float>{-2, -1, 0}));
  EXPECT_EQ(StatsOf(*table, "a").rows_refused(), 1);
}

TEST(EmbeddingTableTest, AStreamOfOneOffIdsStaysWithinTheRowLimit) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 8, Adagrad(0.1f, 0.1f), 1000)});
  std::vector<uint64_t> ids(500);
  std::vector<float> g(ids.size() * 8, 0.5f);
  for (int batch = 0; batch < 40; ++batch) {
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = (uint64_t{1} << 40) | (batch * ids.size() + i);
    ASSERT_TRUE(Apply(*table, Push({Rows("a", ids, g)})).ok());
  }
  const EmbeddingTableStats stats = StatsOf(*table, "a");
  EXPECT_EQ(stats.rows(), 1000);
  EXPECT_EQ(stats.rows_admitted(), 1000);
  EXPECT_EQ(stats.rows_refused(), 19000);
  // Values, state (one accumulator per value), id and count per row, a
  // block at most of slack, and the index.
  const int64_t raw = 1000 * (8 * 4 * 2 + 16);
  EXPECT_GE(stats.bytes(), raw);
  EXPECT_LE(stats.bytes(), raw + RowStore::kRowsPerBlock * (8 * 4 * 2 + 16) + 1000 * 64);
}

TEST(EmbeddingTableTest, RowsSpanningManyBlocksKeepTheirOwnValuesAndState) {
  const int rows = 3 * static_cast<int>(RowStore::kRowsPerBlock) + 17;
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 3, Sgd(1.0f, 0.5f))});
  std::vector<uint64_t> ids(rows);
  std::vector<float> g(rows * 3);
  for (int i = 0; i < rows; ++i) {
    ids[i] = uint64_t{0x9e3779b97f4a7c15} * (i + 1);  // scattered over the id space
    for (int e = 0; e < 3; ++e) g[i * 3 + e] = static_cast<float>(i % 1000) + 0.25f * e;
  }
  // Two halves, then everything again: rows are added across blocks and
  // then updated in place with momentum (v = g, then 0.5 g + g).
  auto rows_of = [&](int first, int last) {
    return Rows("a", std::vector<uint64_t>(ids.begin() + first, ids.begin() + last),
                std::vector<float>(g.begin() + first * 3, g.begin() + last * 3));
  };
  ASSERT_TRUE(Apply(*table, Push({rows_of(0, rows / 2)})).ok());
  ASSERT_TRUE(Apply(*table, Push({rows_of(rows / 2, rows)})).ok());
  ASSERT_TRUE(Apply(*table, Push({rows_of(0, rows)})).ok());
  std::vector<float> expected(g.size());
  for (size_t i = 0; i < g.size(); ++i) expected[i] = -g[i] - (0.5f * g[i] + g[i]);
  EXPECT_EQ(Lookup(*table, "a", ids), expected);
  EXPECT_EQ(StatsOf(*table, "a").rows(), rows);
  EmbeddingTable restored(Options());
  ASSERT_TRUE(restored.Restore(Exported(*table)).ok());
  EXPECT_EQ(Lookup(restored, "a", ids), expected);
  EXPECT_EQ(Snapshot(restored), Snapshot(*table));
}

// --- Checkpoints ---

TEST(EmbeddingTableTest, ACheckpointRoundTripsRowsStateAndCountersAndTrainsOnAlike) {
  EmbeddingTableOptions options = Options(1, 2);
  std::unique_ptr<EmbeddingTable> table =
      Make({Spec("a", 3, Adam(0.01f), 5, 0.1f), Spec("w", 2, Ftrl(0.1f, 1, 0.01f, 0))}, options);
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
      {"a row never updated",
       [](ShardCheckpoint::Embedding* e, uint64_t) { e->mutable_row_updates()->assign(24, '\0'); },
       "no update"},
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

// --- Pulls ---

TEST(EmbeddingTableTest, APullAnswersEachTableInOrderInItsDtypeWithoutCreatingRows) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 2, Sgd(1.0f), 0, 1.0f), Spec("b", 3)});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {4}, {1, 1})})).ok());
  for (DType dtype : {FLOAT32, FLOAT16, BFLOAT16}) {
    SCOPED_TRACE(DType_Name(dtype));
    PullRequest pull;
    pull.set_dtype(dtype);
    EmbeddingRows* b = pull.add_rows();
    b->set_table("b");
    b->set_ids(IdBytes({8}));
    EmbeddingRows* a = pull.add_rows();
    a->set_table("a");
    a->set_ids(IdBytes({5, 4, 5}));
    PullResponse response;
    ASSERT_TRUE(table->AnswerPull(pull, &response).ok());
    ASSERT_EQ(response.rows_size(), 2);
    EXPECT_EQ(response.rows(0).table(), "b");
    EXPECT_EQ(response.rows(1).table(), "a");
    EXPECT_EQ(response.rows(1).dtype(), dtype);
    EXPECT_TRUE(response.rows(1).ids().empty());
    std::string expected;
    EncodeValues(Lookup(*table, "a", {5, 4, 5}), dtype, &expected);
    EXPECT_EQ(response.rows(1).data(), expected);
    EncodeValues(Lookup(*table, "b", {8}), dtype, &expected);
    EXPECT_EQ(response.rows(0).data(), expected);
    EXPECT_EQ(table->AnswerBytes(*a, dtype), 3 * 2 * DTypeBytes(dtype));
  }
  EXPECT_EQ(StatsOf(*table, "a").rows(), 1);
  EXPECT_EQ(StatsOf(*table, "b").rows(), 0);
}

TEST(EmbeddingTableTest, ABadPullIsRefusedNamingTableAndId) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 2)}, Options(0, 2));
  const uint64_t theirs = IdsOfShard(1, 2, 1)[0];
  auto pull_of = [](std::vector<std::pair<std::string, std::string>> parts) {
    PullRequest pull;
    for (auto& [name, ids] : parts) {
      EmbeddingRows* rows = pull.add_rows();
      rows->set_table(name);
      rows->set_ids(ids);
    }
    return pull;
  };
  struct Case {
    const char* name;
    PullRequest pull;
    std::string message;
  };
  PullRequest bad_dtype = pull_of({{"a", IdBytes({})}});
  bad_dtype.set_dtype(static_cast<DType>(9));
  const Case cases[] = {
      {"unknown table", pull_of({{"zz", IdBytes({})}}), "\"zz\""},
      {"table twice", pull_of({{"a", IdBytes({})}, {"a", IdBytes({})}}), "twice"},
      {"ids not whole", pull_of({{"a", "1234"}}), "multiple of 8"},
      {"another shard's id", pull_of({{"a", IdBytes({theirs})}}), absl::StrCat("id ", theirs)},
      {"unknown dtype", bad_dtype, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PullResponse response;
    absl::Status status = table->AnswerPull(c.pull, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_EQ(response.rows_size(), 0);
  }
  std::vector<float> out(3);
  EXPECT_EQ(table->Lookup("a", IdsOfShard(0, 2, 1), out).code(),
            absl::StatusCode::kInvalidArgument);  // room for 1.5 rows
}

// --- Across shards ---

TEST(EmbeddingTableTest, EachShardTakesExactlyTheRowsThatHashToIt) {
  std::vector<std::unique_ptr<EmbeddingTable>> shards;
  for (int s = 0; s < 3; ++s) shards.push_back(Make({Spec("a", 1, Sgd(1.0f))}, Options(s, 3)));
  std::vector<std::vector<uint64_t>> ids(3);
  for (uint64_t id = 0; id < 3000; ++id) ids[ShardOfRow(id, 3)].push_back(id);
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(s);
    EXPECT_NEAR(ids[s].size(), 1000, 100);
    const PushRequest push = Push({Rows("a", ids[s], std::vector<float>(ids[s].size(), 1))});
    ASSERT_TRUE(Apply(*shards[s], push).ok());
    for (int other = 0; other < 3; ++other) {
      TablePush plan;
      if (other != s) {
        EXPECT_FALSE(shards[other]->CheckPush(push, false, true, &plan).ok());
      }
    }
    EXPECT_EQ(StatsOf(*shards[s], "a").rows(), static_cast<int64_t>(ids[s].size()));
  }
}

}  // namespace
}  // namespace pst
