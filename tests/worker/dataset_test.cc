// Data sets and the per-epoch sampler.
#include "worker/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

TEST(ShardSamplerTest, WorkersSplitTheCombinedBatchOfEveryStep) {
  constexpr int64_t kSize = 1000;
  constexpr int kCombined = 32;
  ShardSampler single(kSize, 0, 1, kCombined, 9);
  for (int workers : {1, 2, 4}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    std::vector<ShardSampler> samplers;
    for (int r = 0; r < workers; ++r) samplers.emplace_back(kSize, r, workers, kCombined / workers, 9);
    EXPECT_EQ(samplers[0].steps_per_epoch(), kSize / kCombined);
    for (int epoch : {0, 1}) {
      for (int64_t step = 0; step < samplers[0].steps_per_epoch(); ++step) {
        std::vector<int64_t> joined;
        for (ShardSampler& s : samplers) {
          auto batch = s.Batch(epoch, step);
          joined.insert(joined.end(), batch.begin(), batch.end());
        }
        auto expected = single.Batch(epoch, step);
        ASSERT_EQ(joined, std::vector<int64_t>(expected.begin(), expected.end()));
        ASSERT_EQ(std::set<int64_t>(joined.begin(), joined.end()).size(), joined.size());
      }
    }
  }
}

TEST(ShardSamplerTest, EveryEpochIsAFreshPermutation) {
  ShardSampler sampler(100, 0, 1, 100, 5);
  auto first = sampler.Batch(0, 0);
  std::vector<int64_t> epoch0(first.begin(), first.end());
  auto second = sampler.Batch(1, 0);
  std::vector<int64_t> epoch1(second.begin(), second.end());
  EXPECT_NE(epoch0, epoch1);
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(sorted[i], i);
  ShardSampler again(100, 0, 1, 100, 5);
  auto replay = again.Batch(0, 0);
  EXPECT_EQ(epoch0, std::vector<int64_t>(replay.begin(), replay.end()));
}

TEST(SyntheticDataTest, ProblemsSatisfyTheirEquationsAndAreDeterministic) {
  Dataset q = MakeQuadratic(200, 3);
  ASSERT_EQ(q.feature_dim, 3);
  for (int64_t i = 0; i < q.size; ++i) {
    const float x = q.features[3 * i + 1];
    ASSERT_GE(x, -1.0f);
    ASSERT_LE(x, 1.0f);
    ASSERT_EQ(q.features[3 * i], x * x);
    ASSERT_EQ(q.features[3 * i + 2], 1.0f);
    ASSERT_EQ(q.targets[i], 5.0f * x * x + 3.0f);
  }
  Dataset p = MakeParabola(200, 3);
  for (int64_t i = 0; i < p.size; ++i) {
    ASSERT_LE(std::abs(p.features[i]), 2.0f);
    ASSERT_EQ(p.targets[i], p.features[i] * p.features[i]);
  }
  EXPECT_EQ(MakeParabola(50, 1).features, MakeParabola(50, 1).features);
  EXPECT_NE(MakeParabola(50, 1).features, MakeParabola(50, 2).features);
  Dataset l = MakeLinearRegression(100, 4, 0.0f, 8);
  EXPECT_EQ(l.feature_dim, 4);
  EXPECT_EQ(l.num_classes, 0);
  EXPECT_EQ(l.targets, MakeLinearRegression(100, 4, 0.0f, 8).targets);
}

TEST(FashionMnistTest, LoadsTheDebianPackage) {
  absl::StatusOr<Dataset> train = LoadFashionMnist(kFashionMnistDir, true);
  ASSERT_TRUE(train.ok()) << train.status() << " (the dataset-fashion-mnist package is a dependency)";
  EXPECT_EQ(train->size, 60000);
  EXPECT_EQ(train->feature_dim, 784);
  EXPECT_EQ(train->num_classes, 10);
  std::vector<int> per_class(10, 0);
  for (float label : train->targets) per_class[static_cast<int>(label)]++;
  EXPECT_THAT(per_class, ::testing::Each(6000));
  auto [lo, hi] = std::minmax_element(train->features.begin(), train->features.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
  absl::StatusOr<Dataset> test = LoadFashionMnist(kFashionMnistDir, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->size, 10000);
  absl::StatusOr<Dataset> limited = LoadFashionMnist(kFashionMnistDir, true, 100);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->size, 100);
  EXPECT_TRUE(std::equal(limited->features.begin(), limited->features.end(), train->features.begin()));
}

void WriteGz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::vector<unsigned char> Header(uint32_t magic, std::vector<uint32_t> dims) {
  std::vector<unsigned char> out;
  dims.insert(dims.begin(), magic);
  for (uint32_t v : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<unsigned char>(v >> shift));
  }
  return out;
}

TEST(FashionMnistTest, BrokenFilesSayWhichAndWhy) {
  struct Case {
    std::string name;
    std::vector<unsigned char> images, labels;
    std::string message;
  };
  std::vector<unsigned char> two_images = Header(0x803, {2, 28, 28});
  two_images.resize(two_images.size() + 2 * 784, 7);
  std::vector<unsigned char> two_labels = Header(0x801, {2});
  two_labels.insert(two_labels.end(), {1, 2});
  std::vector<unsigned char> truncated = two_images;
  truncated.resize(truncated.size() - 100);
  std::vector<unsigned char> three_labels = Header(0x801, {3});
  three_labels.insert(three_labels.end(), {1, 2, 3});
  std::vector<unsigned char> bad_label = Header(0x801, {2});
  bad_label.insert(bad_label.end(), {1, 12});
  std::vector<Case> cases = {
      {"wrong magic", Header(0x801, {2, 28, 28}), two_labels, "is not an IDX image file"},
      {"truncated images", truncated, two_labels, "is truncated"},
      {"count mismatch", two_images, three_labels, "has 2 images but"},
      {"label out of range", two_images, bad_label, "has label 12"},
      {"wrong image size", Header(0x803, {2, 32, 32}), two_labels, "32x32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string dir = ::testing::TempDir() + "/broken_fmnist";
    std::filesystem::create_directories(dir);
    WriteGz(dir + "/train-images-idx3-ubyte.gz", c.images);
    WriteGz(dir + "/train-labels-idx1-ubyte.gz", c.labels);
    absl::StatusOr<Dataset> data = LoadFashionMnist(dir, true);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(data.status().message()), HasSubstr(c.message));
  }
}

TEST(FashionMnistTest, MissingDirectoryIsNotFoundAndNamesThePath) {
  absl::StatusOr<Dataset> data = LoadFashionMnist("/nonexistent/fmnist", true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("/nonexistent/fmnist/train-images"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("dataset-fashion-mnist"));
}

}  // namespace
}  // namespace pst
