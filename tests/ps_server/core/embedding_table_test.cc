// The Table contract (ps_server/core/table.h) as the embedding tables keep it:
// rows created by training only, with initial values every shard and
// restart agrees on; pushes checked before anything changes; updates all
// or nothing; row-wise optimizers against hand-computed values; pulls.
// The SYNC step and the row limit are in embedding_table_sync_test.cc,
// checkpoints in embedding_table_checkpoint_test.cc.
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

using namespace embedding_testing;  // NOLINT(build/namespaces)

using ::testing::HasSubstr;

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
      {"parts short of dim",
       {Parted(Spec("a", 4), {{"x", 2, 0.1f}, {"y", 1, 0.1f}})},
       "parts' dims add up to 3, not its dim 4"},
      {"a part without a name", {Parted(Spec("a", 4), {{"", 4, 0.1f}})}, "needs a name"},
      {"a part of dim 0",
       {Parted(Spec("a", 4), {{"x", 0, 0.1f}, {"y", 4, 0.1f}})},
       "needs a name, a dim >= 1"},
      {"a part's NaN init scale",
       {Parted(Spec("a", 4), {{"x", 4, std::nanf("")}})},
       "finite init_scale"},
      {"a part named twice",
       {Parted(Spec("a", 4), {{"x", 2, 0.1f}, {"x", 2, 0.1f}})},
       "named twice"},
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
  // The formula of ps_server/core/embedding_init.h for seed 7, "user", id 42,
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

// A table of parts (two tables side by side) starts, trains, exports and
// restores each part as its table would apart: the same values bit for bit
// under a rule with per-element state.
TEST(EmbeddingTableTest, ATableOfPartsTrainsEachPartAsItsTableApart) {
  const OptimizerConfig rule = Adagrad(0.1f, 0.01f);
  std::unique_ptr<EmbeddingTable> joint =
      Make({Parted(Spec("deep+wide", 4, rule), {{"deep", 3, 0.05f}, {"wide", 1, 0.0f}})});
  std::unique_ptr<EmbeddingTable> apart =
      Make({Spec("deep", 3, rule, 0, 0.05f), Spec("wide", 1, rule, 0, 0.0f)});
  const auto joined = [](const std::vector<float>& deep, const std::vector<float>& wide) {
    std::vector<float> rows;
    for (size_t i = 0; i < wide.size(); ++i) {
      rows.insert(rows.end(), deep.begin() + 3 * i, deep.begin() + 3 * (i + 1));
      rows.push_back(wide[i]);
    }
    return rows;
  };
  const std::vector<uint64_t> ids = {1, 5, 9, 1000};
  EXPECT_EQ(Lookup(*joint, "deep+wide", ids),
            joined(Lookup(*apart, "deep", ids), Lookup(*apart, "wide", ids)));
  for (int step = 0; step < 3; ++step) {
    const std::vector<uint64_t> some = {ids.begin() + step % 2, ids.end() - (step == 1)};
    const std::vector<float> deep = Gradients(some, 3, step);
    const std::vector<float> wide = Gradients(some, 1, step + 7);
    ASSERT_TRUE(Apply(*joint, Push({Rows("deep+wide", some, joined(deep, wide))})).ok());
    ASSERT_TRUE(Apply(*apart, Push({Rows("deep", some, deep), Rows("wide", some, wide)})).ok());
  }
  const std::vector<float> trained = Lookup(*joint, "deep+wide", ids);
  EXPECT_EQ(trained, joined(Lookup(*apart, "deep", ids), Lookup(*apart, "wide", ids)));
  EXPECT_NE(trained[3], 0.0f);  // the wide weight of id 1 trained
  // A checkpoint carries the parts: restored, the table starts and trains
  // its rows as before.
  EmbeddingTable restored(Options());
  ASSERT_TRUE(restored.Restore(Exported(*joint)).ok());
  EXPECT_EQ(Lookup(restored, "deep+wide", ids), trained);
  EXPECT_EQ(Lookup(restored, "deep+wide", {77}), Lookup(*joint, "deep+wide", {77}));
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
  ASSERT_TRUE(table->Stage(push, plan, {}).ok());
  EXPECT_EQ(Lookup(*table, "a", {3, 4}), initial);
  EXPECT_EQ(StatsOf(*table, "a").rows(), 0);
  table->Discard();
  EXPECT_EQ(Lookup(*table, "a", {3, 4}), initial);
  EXPECT_EQ(StatsOf(*table, "a").rows_admitted(), 0);
  table->Commit();  // nothing staged: nothing changes
  EXPECT_EQ(StatsOf(*table, "a").rows(), 0);
  EXPECT_EQ(Exported(*table).embeddings(0).updates(), 0);

  ASSERT_TRUE(table->Stage(push, plan, {}).ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "a", {3, 4}),
            (std::vector<float>{initial[0] - 1, initial[1] - 2, initial[2] + 1, initial[3]}));
  EXPECT_EQ(StatsOf(*table, "a").rows(), 2);
  EXPECT_EQ(StatsOf(*table, "a").rows_admitted(), 2);
  EXPECT_EQ(table->parameter_bytes(), 2 * 2 * int64_t{sizeof(float)});
}

// Rows RAM holds are updated in place at Stage; Discard puts back every
// bit of them (values, Adagrad's accumulators, update counts), after a
// clean stage and after one that failed half way through.
TEST(EmbeddingTableTest, DiscardPutsBackTheRowsAnUpdateWroteInPlace) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 2, Adagrad(0.5f, 0.1f))});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {1, 2, 3}, {1, 2, 3, 4, 5, 6})})).ok());
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {2, 3}, {1, 1, 1, 1})})).ok());
  const std::string before = Snapshot(*table);

  const PushRequest clean = Push({Rows("a", {3, 1, 9}, {1, -1, 2, 2, 1, 1})});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(clean, false, true, &plan).ok());
  ASSERT_TRUE(table->Stage(clean, plan, {}).ok());
  table->Discard();
  EXPECT_EQ(Snapshot(*table), before);

  // Id 2's accumulator overflows once ids 1 and 3 are written.
  const PushRequest failing = Push({Rows("a", {1, 3, 2}, {1, 1, 1, 1, 3e38f, 1})});
  ASSERT_TRUE(table->CheckPush(failing, false, true, &plan).ok());
  absl::Status staged = table->Stage(failing, plan, {});
  EXPECT_EQ(staged.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(staged.message(), HasSubstr("id 2 "));
  table->Discard();
  EXPECT_EQ(Snapshot(*table), before);

  // The same clean update, committed, then changes them.
  ASSERT_TRUE(table->CheckPush(clean, false, true, &plan).ok());
  ASSERT_TRUE(table->Stage(clean, plan, {}).ok());
  table->Commit();
  EXPECT_NE(Snapshot(*table), before);
  EXPECT_EQ(StatsOf(*table, "a").rows(), 4);
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

}  // namespace PST_FILE_ID
}  // namespace pst
