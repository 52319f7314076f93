// Data sets and the per-epoch sampler.
#include "worker/training/dataset.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
constexpr char kMissingPackage[] =
    "; the Debian package dataset-fashion-mnist is a declared dependency of this project";

std::vector<int64_t> Copy(std::span<const int64_t> s) { return {s.begin(), s.end()}; }

// The whole permutation of `epoch`, read back through one worker of batch = size.
std::vector<int64_t> Permutation(int64_t size, uint64_t seed, int epoch) {
  ShardSampler sampler(size, 0, 1, static_cast<int>(size), seed);
  return Copy(sampler.Batch(epoch, 0));
}

bool IsPermutation(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// --- ShardSampler ------------------------------------------------------------

TEST(ShardSamplerTest, WorkersSplitTheCombinedBatchOfEveryStep) {
  constexpr int64_t kSize = 1003;  // not a multiple of the combined batch
  constexpr int kCombined = 32;
  constexpr uint64_t kSeed = 9;
  ShardSampler single(kSize, 0, 1, kCombined, kSeed);
  for (int workers : {1, 2, 4}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    std::vector<ShardSampler> samplers;
    for (int r = 0; r < workers; ++r) {
      samplers.emplace_back(kSize, r, workers, kCombined / workers, kSeed);
    }
    for (int epoch : {0, 1, 2}) {
      SCOPED_TRACE(absl::StrCat("epoch ", epoch));
      std::set<int64_t> seen_this_epoch;
      for (int64_t step = 0; step < single.steps_per_epoch(); ++step) {
        std::vector<int64_t> joined;
        std::set<int64_t> distinct;
        for (ShardSampler& s : samplers) {
          std::span<const int64_t> batch = s.Batch(epoch, step);
          ASSERT_EQ(batch.size(), static_cast<size_t>(kCombined / workers));
          for (int64_t i : batch) {
            // Disjoint from the other workers at this step and from every
            // earlier step of the epoch.
            ASSERT_TRUE(distinct.insert(i).second) << "index " << i << " at step " << step;
            ASSERT_TRUE(seen_this_epoch.insert(i).second) << "index " << i << " repeats";
          }
          joined.insert(joined.end(), batch.begin(), batch.end());
        }
        ASSERT_EQ(joined, Copy(single.Batch(epoch, step))) << "step " << step;
      }
    }
  }
}

TEST(ShardSamplerTest, StepsPerEpochSkipTheRemainder) {
  struct Case {
    int64_t size;
    int workers, batch;
    int64_t steps;
  };
  const Case cases[] = {
      {1000, 1, 32, 31}, {1000, 4, 8, 31}, {1024, 4, 8, 32}, {60000, 2, 64, 468},
      {64, 2, 32, 1},    {63, 2, 32, 0},   {0, 1, 1, 0},     {10, 1, 10, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.size, " examples, ", c.workers, " workers x ", c.batch));
    for (int rank = 0; rank < c.workers; ++rank) {
      ShardSampler sampler(c.size, rank, c.workers, c.batch, 1);
      EXPECT_EQ(sampler.steps_per_epoch(), c.steps);
      if (c.steps > 0) {
        EXPECT_EQ(sampler.Batch(0, c.steps - 1).size(), static_cast<size_t>(c.batch));
      }
    }
  }
}

TEST(ShardSamplerTest, EveryEpochIsADifferentPermutation) {
  constexpr int64_t kSize = 500;
  std::vector<std::vector<int64_t>> epochs;
  for (int epoch = 0; epoch < 20; ++epoch) {
    SCOPED_TRACE(absl::StrCat("epoch ", epoch));
    std::vector<int64_t> p = Permutation(kSize, 5, epoch);
    ASSERT_EQ(p.size(), static_cast<size_t>(kSize));
    EXPECT_TRUE(IsPermutation(p));
    for (const std::vector<int64_t>& earlier : epochs) EXPECT_NE(p, earlier);
    epochs.push_back(std::move(p));
  }
  // Nor is any epoch the identity.
  std::vector<int64_t> identity(kSize);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_THAT(epochs, Each(::testing::Ne(identity)));
}

TEST(ShardSamplerTest, SameSeedSamePermutationAnyOrderOfCalls) {
  ShardSampler a(300, 0, 1, 300, 77);
  ShardSampler b(300, 0, 1, 300, 77);
  const std::vector<int64_t> epoch0 = Copy(a.Batch(0, 0));
  const std::vector<int64_t> epoch3 = Copy(a.Batch(3, 0));
  EXPECT_EQ(Copy(b.Batch(3, 0)), epoch3);  // b jumps straight to epoch 3
  EXPECT_EQ(Copy(b.Batch(0, 0)), epoch0);  // and comes back
  EXPECT_EQ(Copy(a.Batch(0, 0)), epoch0);
  EXPECT_NE(Permutation(300, 78, 0), epoch0);
}

// mt19937_64 is specified exactly by the standard and the shuffle maps its
// output by hand, so the order is the same with every standard library:
// workers built on different machines still agree on their data.
TEST(ShardSamplerTest, PermutationIsPinned) {
  EXPECT_THAT(Permutation(10, 42, 0), ElementsAreArray({2, 0, 4, 7, 8, 3, 5, 1, 9, 6}));
  EXPECT_THAT(Permutation(10, 42, 1), ElementsAreArray({2, 8, 7, 3, 6, 4, 0, 9, 5, 1}));
}

TEST(ShardSamplerTest, OutOfRangeRequestsGiveEmptyBatches) {
  ShardSampler sampler(100, 1, 2, 10, 3);
  ASSERT_EQ(sampler.steps_per_epoch(), 5);
  EXPECT_TRUE(sampler.Batch(0, 5).empty());
  EXPECT_TRUE(sampler.Batch(0, -1).empty());
  EXPECT_TRUE(sampler.Batch(-1, 0).empty());
  EXPECT_EQ(ShardSampler(100, 0, 0, 10, 3).steps_per_epoch(), 0);
  EXPECT_EQ(ShardSampler(100, 0, 2, 0, 3).steps_per_epoch(), 0);
  EXPECT_EQ(ShardSampler(100, 2, 2, 10, 3).steps_per_epoch(), 0);
}

// --- GatherBatch -------------------------------------------------------------

TEST(GatherBatchTest, CopiesTheRequestedRows) {
  Dataset d;
  d.size = 4;
  d.feature_dim = 2;
  d.features = {0, 1, 10, 11, 20, 21, 30, 31};
  d.targets = {100, 101, 102, 103};
  const std::vector<int64_t> rows = {3, 0, 3};
  std::vector<float> x(6, -1), y(3, -1);
  GatherBatch(d, rows, x.data(), y.data());
  EXPECT_THAT(x, ElementsAreArray({30, 31, 0, 1, 30, 31}));
  EXPECT_THAT(y, ElementsAreArray({103, 100, 103}));
}

// --- Synthetic problems ------------------------------------------------------

TEST(SyntheticDataTest, QuadraticAndParabolaSatisfyTheirEquationsExactly) {
  const Dataset q = MakeQuadratic(2000, 3);
  EXPECT_EQ(q.name, "quadratic");
  ASSERT_EQ(q.size, 2000);
  ASSERT_EQ(q.feature_dim, 3);
  EXPECT_EQ(q.target_dim, 1);
  EXPECT_EQ(q.num_classes, 0);
  ASSERT_EQ(q.features.size(), 6000u);
  ASSERT_EQ(q.targets.size(), 2000u);
  float lo = 1, hi = -1;
  for (int64_t i = 0; i < q.size; ++i) {
    const float x = q.features[3 * i + 1];
    ASSERT_GE(x, -1.0f);
    ASSERT_LT(x, 1.0f);
    ASSERT_EQ(q.features[3 * i], x * x);
    ASSERT_EQ(q.features[3 * i + 2], 1.0f);
    ASSERT_EQ(q.targets[i], 5.0f * (x * x) + 3.0f);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_LT(lo, -0.99f);  // the draws cover the interval
  EXPECT_GT(hi, 0.99f);

  const Dataset p = MakeParabola(2000, 3);
  EXPECT_EQ(p.name, "parabola");
  ASSERT_EQ(p.size, 2000);
  ASSERT_EQ(p.feature_dim, 1);
  EXPECT_EQ(p.num_classes, 0);
  lo = 2, hi = -2;
  for (int64_t i = 0; i < p.size; ++i) {
    const float x = p.features[i];
    ASSERT_GE(x, -2.0f);
    ASSERT_LT(x, 2.0f);
    ASSERT_EQ(p.targets[i], x * x);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_LT(lo, -1.98f);
  EXPECT_GT(hi, 1.98f);
}

TEST(SyntheticDataTest, GeneratorsAreDeterministicInTheirSeed) {
  struct Case {
    std::string name;
    Dataset (*make)(uint64_t seed);
  };
  const Case cases[] = {
      {"quadratic", [](uint64_t s) { return MakeQuadratic(100, s); }},
      {"parabola", [](uint64_t s) { return MakeParabola(100, s); }},
      {"linear_regression", [](uint64_t s) { return MakeLinearRegression(100, 5, 0.1f, s); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Dataset a = c.make(11), b = c.make(11), other = c.make(12);
    EXPECT_EQ(a.name, c.name);
    EXPECT_EQ(a.features, b.features);
    EXPECT_EQ(a.targets, b.targets);
    EXPECT_NE(a.features, other.features);
    EXPECT_NE(a.targets, other.targets);
  }
}

// Uniform draws are exact binary fractions mapped by hand, so they too are
// the same with every standard library.
TEST(SyntheticDataTest, ParabolaIsPinned) {
  const Dataset p = MakeParabola(3, 1);
  EXPECT_THAT(p.features, ElementsAreArray({0x1.09f48cp-3f, 0x1.921f92p+0f, 0x1.8fde28p+0f}));
}

// Solves the square system a x = b by Gaussian elimination with partial
// pivoting; a is n x n row-major.
std::vector<double> Solve(std::vector<double> a, std::vector<double> b) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::abs(a[r * n + c]) > std::abs(a[pivot * n + c])) pivot = r;
    }
    for (size_t k = 0; k < n; ++k) std::swap(a[c * n + k], a[pivot * n + k]);
    std::swap(b[c], b[pivot]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      for (size_t k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n);
  for (size_t c = n; c-- > 0;) {
    double s = b[c];
    for (size_t k = c + 1; k < n; ++k) s -= a[c * n + k] * x[k];
    x[c] = s / a[c * n + c];
  }
  return x;
}

TEST(SyntheticDataTest, LinearRegressionIsLinearPlusTheRequestedNoise) {
  constexpr int kFeatures = 4;
  constexpr int64_t kExamples = 20000;
  const Dataset clean = MakeLinearRegression(kExamples, kFeatures, 0.0f, 8);
  EXPECT_EQ(clean.name, "linear_regression");
  ASSERT_EQ(clean.size, kExamples);
  ASSERT_EQ(clean.feature_dim, kFeatures);
  EXPECT_EQ(clean.target_dim, 1);
  EXPECT_EQ(clean.num_classes, 0);

  // Recover (w, b) from the first kFeatures + 1 examples; every other
  // example must then fit them up to float rounding.
  constexpr int n = kFeatures + 1;
  std::vector<double> a(n * n), y(n);
  for (int i = 0; i < n; ++i) {
    for (int f = 0; f < kFeatures; ++f) a[i * n + f] = clean.features[i * kFeatures + f];
    a[i * n + kFeatures] = 1.0;
    y[i] = clean.targets[i];
  }
  const std::vector<double> wb = Solve(a, y);
  double max_residual = 0;
  for (int64_t i = 0; i < kExamples; ++i) {
    double fit = wb[kFeatures];
    for (int f = 0; f < kFeatures; ++f) fit += wb[f] * clean.features[i * kFeatures + f];
    max_residual = std::max(max_residual, std::abs(fit - clean.targets[i]));
  }
  EXPECT_LT(max_residual, 1e-4);

  // x ~ N(0, 1).
  const double mean =
      std::accumulate(clean.features.begin(), clean.features.end(), 0.0) / clean.features.size();
  double var = 0;
  for (float x : clean.features) var += (x - mean) * (x - mean);
  var /= clean.features.size();
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.03);

  // Noise changes only the targets, by noise * N(0, 1).
  const Dataset noisy = MakeLinearRegression(kExamples, kFeatures, 0.5f, 8);
  EXPECT_EQ(noisy.features, clean.features);
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < kExamples; ++i) {
    const double e = noisy.targets[i] - clean.targets[i];
    sum += e;
    sum_sq += e * e;
  }
  EXPECT_NEAR(sum / kExamples, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_sq / kExamples), 0.5, 0.02);

  // The weights depend on the seed, not on the number of examples.
  const Dataset few = MakeLinearRegression(10, kFeatures, 0.0f, 8);
  EXPECT_TRUE(std::equal(few.targets.begin(), few.targets.end(), clean.targets.begin()));
}

TEST(SyntheticDataTest, NoExamplesGiveAnEmptySet) {
  EXPECT_EQ(MakeQuadratic(0, 1).size, 0);
  EXPECT_TRUE(MakeParabola(-5, 1).features.empty());
  EXPECT_TRUE(MakeLinearRegression(0, 3, 0.1f, 1).targets.empty());
}

// --- Fashion-MNIST from the Debian package -----------------------------------

void ExpectBalancedLabels(const Dataset& d, int per_class) {
  std::vector<int> counts(10, 0);
  for (float label : d.targets) {
    ASSERT_EQ(label, std::floor(label));
    ASSERT_GE(label, 0.0f);
    ASSERT_LT(label, 10.0f);
    counts[static_cast<int>(label)]++;
  }
  EXPECT_THAT(counts, Each(per_class));
}

void ExpectPixelsInUnitRange(const Dataset& d) {
  auto [lo, hi] = std::minmax_element(d.features.begin(), d.features.end());
  EXPECT_EQ(*lo, 0.0f);
  EXPECT_EQ(*hi, 1.0f);
}

TEST(FashionMnistTest, TrainingSetHas60000BalancedExamples) {
  absl::StatusOr<Dataset> train = LoadFashionMnist(kFashionMnistDir, true);
  ASSERT_TRUE(train.ok()) << train.status() << kMissingPackage;
  EXPECT_EQ(train->name, "fashion_mnist_train");
  ASSERT_EQ(train->size, 60000);
  EXPECT_EQ(train->feature_dim, 784);
  EXPECT_EQ(train->target_dim, 1);
  EXPECT_EQ(train->num_classes, 10);
  ASSERT_EQ(train->features.size(), 60000u * 784);
  ASSERT_EQ(train->targets.size(), 60000u);
  ExpectBalancedLabels(*train, 6000);
  ExpectPixelsInUnitRange(*train);
  // The well-known first label of the training set: 9, an ankle boot.
  EXPECT_EQ(train->targets[0], 9.0f);
}

TEST(FashionMnistTest, TestSetHas10000BalancedExamples) {
  absl::StatusOr<Dataset> test = LoadFashionMnist(kFashionMnistDir, false);
  ASSERT_TRUE(test.ok()) << test.status() << kMissingPackage;
  EXPECT_EQ(test->name, "fashion_mnist_test");
  ASSERT_EQ(test->size, 10000);
  ASSERT_EQ(test->features.size(), 10000u * 784);
  ExpectBalancedLabels(*test, 1000);
  ExpectPixelsInUnitRange(*test);
}

TEST(FashionMnistTest, LimitKeepsTheFirstExamples) {
  absl::StatusOr<Dataset> some = LoadFashionMnist(kFashionMnistDir, true, 1000);
  ASSERT_TRUE(some.ok()) << some.status() << kMissingPackage;
  absl::StatusOr<Dataset> fewer = LoadFashionMnist(kFashionMnistDir, true, 100);
  ASSERT_TRUE(fewer.ok()) << fewer.status();
  ASSERT_EQ(some->size, 1000);
  ASSERT_EQ(fewer->size, 100);
  ASSERT_EQ(fewer->features.size(), 100u * 784);
  ASSERT_EQ(fewer->targets.size(), 100u);
  EXPECT_TRUE(std::equal(fewer->features.begin(), fewer->features.end(), some->features.begin()));
  EXPECT_TRUE(std::equal(fewer->targets.begin(), fewer->targets.end(), some->targets.begin()));
  absl::StatusOr<Dataset> beyond = LoadFashionMnist(kFashionMnistDir, false, 1 << 20);
  ASSERT_TRUE(beyond.ok()) << beyond.status();
  EXPECT_EQ(beyond->size, 10000);
}

// --- Fashion-MNIST files written here ----------------------------------------

// A directory of this process's own (ctest runs test binaries side by
// side), removed when the test is done with it.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(absl::StrCat(::testing::TempDir(), "/dataset_test.", getpid(), ".", name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteGz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

void WriteRaw(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<unsigned char> ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<unsigned char> Idx(uint32_t magic, std::vector<uint32_t> dims,
                               std::vector<unsigned char> body = {}) {
  std::vector<unsigned char> out;
  dims.insert(dims.begin(), magic);
  for (uint32_t v : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<unsigned char>(v >> shift));
  }
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// `n` images whose pixel k of image i is (i + k) % 256.
std::vector<unsigned char> Images(uint32_t n, uint32_t side = 28) {
  std::vector<unsigned char> body(size_t{n} * side * side);
  for (size_t j = 0; j < body.size(); ++j) {
    body[j] = static_cast<unsigned char>(j / (side * side) + j % (side * side));
  }
  return Idx(0x803, {n, side, side}, body);
}

std::vector<unsigned char> Labels(std::vector<unsigned char> labels) {
  return Idx(0x801, {static_cast<uint32_t>(labels.size())}, labels);
}

TEST(FashionMnistFilesTest, ReadsAWellFormedPairExactly) {
  const ScratchDir scratch("good");
  const std::string& dir = scratch.path();
  WriteGz(dir + "/t10k-images-idx3-ubyte.gz", Images(3));
  WriteGz(dir + "/t10k-labels-idx1-ubyte.gz", Labels({4, 0, 9}));
  absl::StatusOr<Dataset> data = LoadFashionMnist(dir, false);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size, 3);
  EXPECT_THAT(data->targets, ElementsAreArray({4.0f, 0.0f, 9.0f}));
  ASSERT_EQ(data->features.size(), 3u * 784);
  for (size_t j = 0; j < data->features.size(); ++j) {
    const int byte = static_cast<unsigned char>(j / 784 + j % 784);
    ASSERT_EQ(data->features[j], static_cast<float>(byte) / 255.0f) << "pixel " << j;
  }
  absl::StatusOr<Dataset> limited = LoadFashionMnist(dir, false, 2);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->size, 2);
  EXPECT_THAT(limited->targets, ElementsAreArray({4.0f, 0.0f}));
  EXPECT_TRUE(std::equal(limited->features.begin(), limited->features.end(),
                         data->features.begin()));
}

TEST(FashionMnistFilesTest, BrokenFilesAreInvalidArgumentNamingTheFile) {
  const std::vector<unsigned char> images = Images(2);
  const std::vector<unsigned char> labels = Labels({1, 2});
  std::vector<unsigned char> short_images = images;
  short_images.resize(short_images.size() - 100);
  std::vector<unsigned char> short_labels = labels;
  short_labels.pop_back();
  // A gzip header followed by a deflate block of the reserved type 3.
  const std::vector<unsigned char> bad_deflate = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3,
                                                  0xff, 0xff, 0xff, 0xff};
  struct Case {
    std::string name;
    std::vector<unsigned char> images, labels;
    bool compressed_stream_cut = false;  // cut the .gz file itself in half
    bool raw_images = false;              // write the images file as is
    std::string bad_file;                 // "images" or "labels"
    std::string message;
  };
  const std::vector<Case> cases = {
      {"image file with a label magic", Labels({1, 2}), labels, false, false, "images",
       "is not an IDX image file (magic 0x00000801, expected 0x00000803)"},
      {"label file with an image magic", images, Images(2), false, false, "labels",
       "is not an IDX label file (magic 0x00000803, expected 0x00000801)"},
      {"header cut short", {0, 0, 8, 3, 0, 0}, labels, false, false, "images",
       "is truncated: it ends inside the IDX header"},
      {"pixels cut short", short_images, labels, false, false, "images",
       "is truncated: it ends inside the pixels"},
      {"labels cut short", images, short_labels, false, false, "labels",
       "is truncated: it ends inside the labels"},
      {"gzip stream cut short", Images(50), Labels(std::vector<unsigned char>(50, 3)), true, false,
       "images", "is truncated"},
      {"corrupt deflate data", bad_deflate, labels, false, true, "images", "is corrupt"},
      {"more labels than images", images, Labels({1, 2, 3}), false, false, "images",
       "has 2 images but"},
      {"label out of range", images, Labels({1, 12}), false, false, "labels",
       "has label 12 at index 1"},
      {"images not 28x28", Images(2, 32), labels, false, false, "images", "holds 32x32 images"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.name);
    const ScratchDir scratch(absl::StrCat("broken", i));
    const std::string& dir = scratch.path();
    const std::string image_path = dir + "/train-images-idx3-ubyte.gz";
    const std::string label_path = dir + "/train-labels-idx1-ubyte.gz";
    if (c.raw_images) {
      WriteRaw(image_path, c.images);
    } else {
      WriteGz(image_path, c.images);
    }
    WriteGz(label_path, c.labels);
    if (c.compressed_stream_cut) {
      std::vector<unsigned char> gz = ReadRaw(image_path);
      gz.resize(gz.size() / 2);
      WriteRaw(image_path, gz);
    }
    absl::StatusOr<Dataset> data = LoadFashionMnist(dir, true);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
    EXPECT_THAT(std::string(data.status().message()),
                AllOf(HasSubstr(c.bad_file == "images" ? image_path : label_path),
                      HasSubstr(c.message)));
  }
}

TEST(FashionMnistFilesTest, MissingFilesAreNotFoundNamingThePathAndTheFix) {
  const ScratchDir scratch("images_only");
  const std::string& half = scratch.path();
  WriteGz(half + "/t10k-images-idx3-ubyte.gz", Images(1));
  struct Case {
    std::string dir;
    bool train;
    std::string missing;
  };
  const Case cases[] = {
      {"/nonexistent/fmnist", true, "/nonexistent/fmnist/train-images-idx3-ubyte.gz"},
      {"/nonexistent/fmnist", false, "/nonexistent/fmnist/t10k-images-idx3-ubyte.gz"},
      {half, false, half + "/t10k-labels-idx1-ubyte.gz"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.missing);
    absl::StatusOr<Dataset> data = LoadFashionMnist(c.dir, c.train);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound) << data.status();
    EXPECT_THAT(std::string(data.status().message()),
                AllOf(HasSubstr("cannot open " + c.missing), HasSubstr("No such file"),
                      HasSubstr("dataset-fashion-mnist"),
                      HasSubstr("training.dataset.fashion_mnist.dir")));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
