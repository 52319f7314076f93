// The checks of a click-model job: configs/ctr.textproto loads, and each
// mistake is named by its field.
#include "common/ctr_config.h"

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
