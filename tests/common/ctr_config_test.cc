// The checks of a click-model job: configs/ctr.textproto loads, and each
// mistake is named by its field.
#include "common/ctr_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr char kCtrJob[] = R"(
cluster { ps: "127.0.0.1:50061" workers: 2 }
training {
  optimizer { adagrad { learning_rate: 0.05 } }
  model {
    ctr { table: "categorical" wide_table: "wide" hidden: 64 }
    embeddings { name: "categorical" dim: 8 }
    embeddings { name: "wide" dim: 1 }
  }
  dataset { ctr { train_file: "/tmp/a.tsv" test_file: "/tmp/b.tsv" generate {} } }
}
)";

absl::Status Check(const std::string& text) {
  absl::StatusOr<JobConfig> config = ParseConfig(text, "test");
  if (!config.ok()) return config.status();
  ApplyDefaults(&*config);
  return ValidateConfig(*config);
}

TEST(CtrConfigTest, TheShippedConfigAndThisOneLoad) {
  EXPECT_TRUE(Check(kCtrJob).ok()) << Check(kCtrJob);
  absl::StatusOr<JobConfig> shipped = LoadJobConfig(
      absl::StrCat(PST_SOURCE_DIR, "/configs/ctr.textproto"), {});
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  // 26 fields x 8 + 13 dense into 64, 32, 1.
  EXPECT_EQ(ModelParameterCount(shipped->training()),
            (26 * 8 + 13) * 64 + 64 + 64 * 32 + 32 + 32 + 1);
}

CtrTables TablesOf(const std::string& text) {
  absl::StatusOr<JobConfig> config = ParseConfig(text, "test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyDefaults(&*config);
  absl::StatusOr<CtrTables> tables = CtrShardTables(config->training());
  EXPECT_TRUE(tables.ok()) << tables.status();
  return tables.ok() ? *std::move(tables) : CtrTables{};
}

// The deep and wide tables, trained and stored alike, are one table of
// parts on the shards; anything else keeps them apart.
TEST(CtrConfigTest, TablesTrainedAlikeAreKeptAsOne) {
  const CtrTables joint = TablesOf(kCtrJob);
  ASSERT_TRUE(joint.joint);
  EXPECT_EQ(joint.deep, "categorical+wide");
  EXPECT_EQ(joint.wide, "");
  ASSERT_EQ(joint.tables.size(), 1u);
  const EmbeddingTableConfig& table = joint.tables[0];
  EXPECT_EQ(table.name(), "categorical+wide");
  EXPECT_EQ(table.dim(), 9);
  EXPECT_TRUE(table.optimizer().has_adagrad());  // resolved: the job's
  ASSERT_EQ(table.parts_size(), 2);
  EXPECT_EQ(table.parts(0).name(), "categorical");
  EXPECT_EQ(table.parts(0).dim(), 8);
  EXPECT_FLOAT_EQ(table.parts(0).init_scale(), 1.0f / std::sqrt(8.0f));  // resolved default
  EXPECT_EQ(table.parts(1).name(), "wide");
  EXPECT_EQ(table.parts(1).dim(), 1);
  EXPECT_FLOAT_EQ(table.parts(1).init_scale(), 1.0f);

  const std::string apart_because[] = {
      "name: \"wide\" dim: 1 optimizer { sgd { learning_rate: 0.1 } }",
      "name: \"wide\" dim: 1 max_rows_per_shard: 1000",
      "name: \"wide\" dim: 1 when_full: REFUSE_NEW_ROWS",
      "name: \"wide\" dim: 1 storage { ttl_steps: 100 }",
      "name: \"wide\" dim: 1 storage { memory_bytes: 1000000 }",
  };
  for (const std::string& wide : apart_because) {
    SCOPED_TRACE(wide);
    const CtrTables apart =
        TablesOf(absl::StrReplaceAll(kCtrJob, {{"name: \"wide\" dim: 1", wide}}));
    EXPECT_FALSE(apart.joint);
    EXPECT_EQ(apart.deep, "categorical");
    EXPECT_EQ(apart.wide, "wide");
    ASSERT_EQ(apart.tables.size(), 2u);
    EXPECT_EQ(apart.tables[0].parts_size(), 0);
  }
  // Tiers alike: one tier, under both budgets.
  const CtrTables tiered = TablesOf(absl::StrReplaceAll(
      kCtrJob,
      {{"name: \"categorical\" dim: 8",
        "name: \"categorical\" dim: 8 storage { memory_bytes: 3000 disk: \"/d\" ttl_steps: 9 }"},
       {"name: \"wide\" dim: 1",
        "name: \"wide\" dim: 1 storage { memory_bytes: 500 disk: \"/d\" ttl_steps: 9 }"}}));
  ASSERT_TRUE(tiered.joint);
  ASSERT_EQ(tiered.tables.size(), 1u);
  EXPECT_EQ(tiered.tables[0].storage().memory_bytes(), 3500);
  EXPECT_EQ(tiered.tables[0].storage().disk(), "/d");
  EXPECT_EQ(tiered.tables[0].storage().ttl_steps(), 9);
  const CtrTables other_disk = TablesOf(absl::StrReplaceAll(
      kCtrJob, {{"name: \"categorical\" dim: 8",
                 "name: \"categorical\" dim: 8 storage { memory_bytes: 3000 disk: \"/d\" }"},
                {"name: \"wide\" dim: 1",
                 "name: \"wide\" dim: 1 storage { memory_bytes: 500 disk: \"/e\" }"}}));
  EXPECT_FALSE(other_disk.joint);
  // Without a wide part, or where the joint name is another table's.
  const CtrTables deep_only =
      TablesOf(absl::StrReplaceAll(kCtrJob, {{"wide_table: \"wide\"", ""}}));
  EXPECT_FALSE(deep_only.joint);
  EXPECT_EQ(deep_only.tables.size(), 2u);
  const CtrTables taken = TablesOf(absl::StrReplaceAll(
      kCtrJob, {{"embeddings { name: \"wide\" dim: 1 }",
                 "embeddings { name: \"wide\" dim: 1 } embeddings { name: \"categorical+wide\" "
                 "dim: 2 }"}}));
  EXPECT_FALSE(taken.joint);
  EXPECT_EQ(taken.tables.size(), 3u);
}

TEST(CtrConfigTest, MistakesAreNamedByTheirField) {
  struct Case {
    std::string from, to, field;
  };
  const Case cases[] = {
      {"table: \"categorical\" wide", "table: \"other\" wide", "training.model.ctr.table"},
      {"wide_table: \"wide\"", "wide_table: \"categorical\"", "training.model.ctr.wide_table"},
      {"name: \"wide\" dim: 1", "name: \"wide\" dim: 2", "training.model.ctr.wide_table"},
      {"hidden: 64", "hidden: 0", "training.model.ctr.hidden[0]"},
      {"test_file: \"/tmp/b.tsv\"", "", "training.dataset.ctr"},
      {"generate {}", "format: LIBSVM generate {}", "training.dataset.ctr.generate"},
      {"generate {}", "generate { distinct: 5 distinct: 6 }",
       "training.dataset.ctr.generate.distinct"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    const std::string text = absl::StrReplaceAll(kCtrJob, {{c.from, c.to}});
    ASSERT_NE(text, kCtrJob);
    absl::Status status = Check(text);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.field));
  }
  // A ctr model needs ctr data, and ctr data a ctr model.
  const std::string ctr_on_images = absl::StrReplaceAll(
      kCtrJob, {{"dataset { ctr { train_file: \"/tmp/a.tsv\" test_file: \"/tmp/b.tsv\" generate {} } }",
                 "dataset { fashion_mnist {} }"}});
  ASSERT_NE(ctr_on_images, kCtrJob);
  EXPECT_THAT(std::string(Check(ctr_on_images).message()),
              HasSubstr("training.dataset must be ctr { ... } for a ctr model"));
  const std::string mlp_on_ctr = absl::StrReplaceAll(
      kCtrJob, {{"ctr { table: \"categorical\" wide_table: \"wide\" hidden: 64 }",
                 "mlp { hidden: 64 }"}});
  EXPECT_THAT(std::string(Check(mlp_on_ctr).message()),
              HasSubstr("training.model must be ctr { ... } for ctr data"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
