#include "worker/dataset.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;
constexpr int kImageSide = 28;
constexpr int kClasses = 10;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly `size` bytes; false on a short read.
bool ReadExactly(gzFile file, void* out, size_t size) {
  char* dst = static_cast<char*>(out);
  while (size > 0) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(size, 1u << 30));
    int got = gzread(file, dst, chunk);
    if (got <= 0) return false;
    dst += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

uint32_t BigEndian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

absl::StatusOr<GzFile> Open(const std::string& path) {
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open ", path, ": ", std::strerror(errno),
        "; install Debian's dataset-fashion-mnist package or set "
        "training.dataset.fashion_mnist.dir"));
  }
  gzbuffer(file.get(), 1 << 20);
  return file;
}

// Reads an IDX header: the magic number and `dims` big-endian sizes.
absl::Status ReadHeader(gzFile file, const std::string& path, uint32_t magic, int dims,
                        uint32_t* sizes) {
  unsigned char header[16];
  const size_t bytes = 4 * (1 + dims);
  if (!ReadExactly(file, header, bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is too short for an IDX header"));
  }
  if (BigEndian(header) != magic) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not an IDX ", magic == kImageMagic ? "image" : "label", " file (magic 0x",
        absl::Hex(BigEndian(header), absl::kZeroPad8), ", expected 0x",
        absl::Hex(magic, absl::kZeroPad8), ")"));
  }
  for (int d = 0; d < dims; ++d) sizes[d] = BigEndian(header + 4 * (1 + d));
  return absl::OkStatus();
}

// splitmix64: decorrelates (seed, epoch) into a generator seed.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Hand-made draws: the std distributions' outputs differ between standard
// libraries, and every process of a job must see the same data.
class Random {
 public:
  explicit Random(uint64_t seed) : rng_(Mix(seed)) {}
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Normal() {  // Box-Muller
    double u1 = Uniform();
    double u2 = Uniform();
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * M_PI * u2);
  }
  // Unbiased integer in [0, bound) by rejection.
  uint64_t Below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do {
      r = rng_();
    } while (r >= limit);
    return r % bound;
  }

 private:
  std::mt19937_64 rng_;
};

Dataset Regression(std::string name, int64_t examples, int features) {
  Dataset d;
  d.name = std::move(name);
  d.size = examples;
  d.feature_dim = features;
  d.target_dim = 1;
  d.features.resize(static_cast<size_t>(examples) * features);
  d.targets.resize(examples);
  return d;
}

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train, int64_t limit) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string image_path = absl::StrCat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  const std::string label_path = absl::StrCat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  absl::StatusOr<GzFile> images = Open(image_path);
  if (!images.ok()) return images.status();
  absl::StatusOr<GzFile> labels = Open(label_path);
  if (!labels.ok()) return labels.status();

  uint32_t image_dims[3] = {0, 0, 0};
  uint32_t label_count = 0;
  if (absl::Status s = ReadHeader(images->get(), image_path, kImageMagic, 3, image_dims); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadHeader(labels->get(), label_path, kLabelMagic, 1, &label_count);
      !s.ok()) {
    return s;
  }
  if (image_dims[1] != kImageSide || image_dims[2] != kImageSide) {
    return absl::InvalidArgumentError(absl::StrCat(image_path, " holds ", image_dims[1], "x",
                                                   image_dims[2], " images, expected 28x28"));
  }
  if (image_dims[0] != label_count) {
    return absl::InvalidArgumentError(absl::StrCat(image_path, " has ", image_dims[0],
                                                   " images but ", label_path, " has ",
                                                   label_count, " labels"));
  }
  int64_t count = image_dims[0];
  if (limit > 0) count = std::min(count, limit);
  const size_t pixels = static_cast<size_t>(kImageSide) * kImageSide;

  Dataset d;
  d.name = train ? "fashion_mnist_train" : "fashion_mnist_test";
  d.size = count;
  d.feature_dim = static_cast<int>(pixels);
  d.target_dim = 1;
  d.num_classes = kClasses;
  std::vector<unsigned char> raw(static_cast<size_t>(count) * pixels);
  if (!ReadExactly(images->get(), raw.data(), raw.size())) {
    return absl::InvalidArgumentError(absl::StrCat(image_path, " is truncated: fewer than ",
                                                   count, " images"));
  }
  d.features.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) d.features[i] = raw[i] * (1.0f / 255.0f);
  raw.resize(count);
  if (!ReadExactly(labels->get(), raw.data(), count)) {
    return absl::InvalidArgumentError(absl::StrCat(label_path, " is truncated: fewer than ",
                                                   count, " labels"));
  }
  d.targets.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    if (raw[i] >= kClasses) {
      return absl::InvalidArgumentError(absl::StrCat(label_path, " has label ", raw[i],
                                                     " at index ", i, "; labels must be 0-9"));
    }
    d.targets[i] = raw[i];
  }
  return d;
}

Dataset MakeQuadratic(int64_t examples, uint64_t seed) {
  Dataset d = Regression("quadratic", examples, 3);
  Random random(seed);
  for (int64_t i = 0; i < examples; ++i) {
    const float x = static_cast<float>(random.Uniform(-1.0, 1.0));
    d.features[3 * i] = x * x;
    d.features[3 * i + 1] = x;
    d.features[3 * i + 2] = 1.0f;
    d.targets[i] = 5.0f * x * x + 3.0f;
  }
  return d;
}

Dataset MakeParabola(int64_t examples, uint64_t seed) {
  Dataset d = Regression("parabola", examples, 1);
  Random random(seed);
  for (int64_t i = 0; i < examples; ++i) {
    const float x = static_cast<float>(random.Uniform(-2.0, 2.0));
    d.features[i] = x;
    d.targets[i] = x * x;
  }
  return d;
}

Dataset MakeLinearRegression(int64_t examples, int features, float noise, uint64_t seed) {
  Dataset d = Regression("linear_regression", examples, features);
  // The true weights depend on the seed alone; the samples on the seed and
  // a stream of their own, so train and test sets share the same w and b.
  Random truth(seed);
  std::vector<double> w(features);
  for (double& v : w) v = truth.Normal();
  const double b = truth.Normal();
  Random sample(Mix(seed) ^ 0x5EED);
  for (int64_t i = 0; i < examples; ++i) {
    double y = b;
    for (int f = 0; f < features; ++f) {
      const float x = static_cast<float>(sample.Normal());
      d.features[static_cast<size_t>(i) * features + f] = x;
      y += w[f] * x;
    }
    d.targets[i] = static_cast<float>(y + noise * sample.Normal());
  }
  return d;
}

ShardSampler::ShardSampler(int64_t dataset_size, int rank, int num_workers, int batch_size,
                           uint64_t seed)
    : dataset_size_(dataset_size),
      rank_(rank),
      num_workers_(num_workers),
      batch_size_(batch_size),
      seed_(seed),
      steps_per_epoch_(dataset_size / (static_cast<int64_t>(num_workers) * batch_size)) {}

std::span<const int64_t> ShardSampler::Batch(int epoch, int64_t step) {
  if (epoch != current_epoch_) {
    permutation_.resize(dataset_size_);
    std::iota(permutation_.begin(), permutation_.end(), 0);
    Random random(Mix(seed_) ^ static_cast<uint64_t>(epoch));
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {  // Fisher-Yates
      std::swap(permutation_[i], permutation_[random.Below(i + 1)]);
    }
    current_epoch_ = epoch;
  }
  const int64_t start = (step * num_workers_ + rank_) * batch_size_;
  return {permutation_.data() + start, static_cast<size_t>(batch_size_)};
}

void GatherBatch(const Dataset& data, std::span<const int64_t> indices, float* x,
                 float* targets) {
  const size_t fx = data.feature_dim, ft = data.target_dim;
  for (size_t r = 0; r < indices.size(); ++r) {
    std::memcpy(x + r * fx, data.features.data() + indices[r] * fx, fx * sizeof(float));
    std::memcpy(targets + r * ft, data.targets.data() + indices[r] * ft, ft * sizeof(float));
  }
}

}  // namespace pst
