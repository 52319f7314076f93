// The planted-model generator: deterministic by seed, Criteo files the
// reader accepts, and a planted AUC well above chance.
#include "data/ctr_generator.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "data/auc.h"
#include "data/ctr_reader.h"
#include "data/zipf.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CtrGeneratorTest, FilesAreDeterministicBySeedAndReadable) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("ctr_generator_test_", getpid());
  std::filesystem::create_directories(dir);
  CtrGeneratorOptions options;
  options.train_examples = 3000;
  options.test_examples = 2000;
  const std::string a = (dir / "a.tsv").string(), b = (dir / "b.tsv").string();
  const std::string c = (dir / "c.tsv.gz").string(), d = (dir / "d.tsv").string();
  absl::StatusOr<PlantedModel> first = GenerateCtrFiles(options, a, b);
  absl::StatusOr<PlantedModel> again = GenerateCtrFiles(options, c, d);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(first->test_auc, again->test_auc);
  EXPECT_EQ(Slurp(b), Slurp(d));
  EXPECT_GT(first->test_auc, 0.7);
  EXPECT_GT(first->click_rate, 0.1);
  EXPECT_LT(first->click_rate, 0.5);
  absl::StatusOr<std::vector<int64_t>> train = CountShares(c, {});
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)[0], 3000);

  options.seed = 2;
  ASSERT_TRUE(GenerateCtrFiles(options, c, d).ok());
  EXPECT_NE(Slurp(b), Slurp(d));

  ASSERT_TRUE(WritePlantedRecord(b, options, *first).ok());
  std::optional<PlantedModel> record = ReadPlantedRecord(b, options);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->test_auc, first->test_auc);
  options.seed = 3;
  EXPECT_FALSE(ReadPlantedRecord(b, options).has_value());  // other options: generate again
  std::filesystem::remove_all(dir);
}

TEST(CtrGeneratorTest, RefusesBadOptions) {
  CtrGeneratorOptions options;
  options.distinct = {10, 20};
  EXPECT_EQ(GenerateCtrFiles(options, "/nonexistent/a", "/nonexistent/b").status().code(),
            absl::StatusCode::kInvalidArgument);
  options.distinct = {100};
  options.zipf_exponent = 0.0;
  EXPECT_EQ(GenerateCtrFiles(options, "/nonexistent/a", "/nonexistent/b").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ZipfSamplerTest, FrequenciesFollowTheLawAndStayInRange) {
  for (double exponent : {0.8, 1.0, 1.2}) {
    SCOPED_TRACE(exponent);
    ZipfSampler zipf(1000, exponent);
    std::mt19937_64 rng(5);
    std::map<int64_t, int> counts;
    constexpr int kDraws = 400000;
    for (int i = 0; i < kDraws; ++i) {
      const int64_t k = zipf.Draw(rng);
      ASSERT_GE(k, 1);
      ASSERT_LE(k, 1000);
      ++counts[k];
    }
    double norm = 0.0;
    for (int k = 1; k <= 1000; ++k) norm += std::pow(k, -exponent);
    for (int k : {1, 2, 10}) {
      const double expected = kDraws * std::pow(k, -exponent) / norm;
      EXPECT_NEAR(counts[k], expected, 5 * std::sqrt(expected)) << "rank " << k;
    }
  }
  ZipfSampler huge(100000000, 1.1);  // 10^8 values cost no memory
  std::mt19937_64 rng(1);
  for (int i = 0; i < 1000; ++i) ASSERT_LE(huge.Draw(rng), 100000000);
}

TEST(AucTest, CountsPairsAndTiesHalf) {
  const float labels[] = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, labels), 1.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, labels), 0.0);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, labels), 0.5);
  EXPECT_DOUBLE_EQ(Auc(std::vector<float>{0.1f, 0.3f, 0.2f, 0.4f}, labels), 0.75);
  EXPECT_NEAR(LogLoss(std::vector<float>{0.5f, 0.5f}, std::vector<float>{0, 1}), std::log(2.0),
              1e-9);
}

}  // namespace PST_FILE_ID
}  // namespace pst
