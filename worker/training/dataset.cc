#include "worker/training/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pst {
namespace {

constexpr uint32_t kImageMagic = 0x00000803;
constexpr uint32_t kLabelMagic = 0x00000801;
constexpr int kImageSide = 28;
constexpr size_t kPixels = size_t{kImageSide} * kImageSide;
constexpr int kClasses = 10;
// Images are decoded this many at a time: big enough that gzread inflates
// straight into our buffer, small enough to stay in cache while converted.
constexpr size_t kImagesPerChunk = 1024;
constexpr size_t kLabelsPerChunk = size_t{1} << 16;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

absl::StatusOr<GzFile> Open(const std::string& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (!file) {
    const int error = errno;
    return absl::NotFoundError(absl::StrCat(
        "cannot open ", path, ": ", error != 0 ? std::strerror(error) : "out of memory",
        "; install Debian's dataset-fashion-mnist package or set "
        "training.dataset.fashion_mnist.dir"));
  }
  gzbuffer(file.get(), 1 << 18);
  return file;
}

// Reads exactly `size` bytes. A short read is a truncated file (zlib reports
// a gzip stream cut short the same way: "unexpected end of file"); anything
// else zlib complains about is corruption or an I/O error. `what` names the
// part being read, for the message.
absl::Status ReadExactly(gzFile file, const std::string& path, const char* what, void* out,
                         size_t size) {
  char* dst = static_cast<char*>(out);
  while (size > 0) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size, size_t{1} << 30));
    const int got = gzread(file, dst, chunk);
    if (got <= 0) {
      int code = Z_OK;
      const char* message = gzerror(file, &code);
      if (code == Z_OK || code == Z_BUF_ERROR) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " is truncated: it ends inside the ", what));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is corrupt or unreadable: ", message, " (reading the ", what, ")"));
    }
    dst += got;
    size -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

uint32_t BigEndian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Reads an IDX header: the magic number, then `dims` big-endian sizes. The
// magic comes first on its own, so a file of the wrong kind is named as such
// even when it is too short for the header expected.
absl::Status ReadHeader(gzFile file, const std::string& path, uint32_t magic, int dims,
                        uint32_t* sizes) {
  unsigned char word[4];
  PST_RETURN_IF_ERROR(ReadExactly(file, path, "IDX header", word, 4));
  const uint32_t found = BigEndian(word);
  if (found != magic) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not an IDX ", magic == kImageMagic ? "image" : "label", " file (magic 0x",
        absl::Hex(found, absl::kZeroPad8), ", expected 0x", absl::Hex(magic, absl::kZeroPad8),
        ")"));
  }
  for (int d = 0; d < dims; ++d) {
    PST_RETURN_IF_ERROR(ReadExactly(file, path, "IDX header", word, 4));
    sizes[d] = BigEndian(word);
  }
  return absl::OkStatus();
}

// Appends `count` labels to `targets` as floats. Read a chunk at a time so
// that a header claiming billions of labels fails on the missing data rather
// than on a huge allocation.
absl::Status ReadLabels(gzFile file, const std::string& path, int64_t count,
                        std::vector<float>* targets) {
  std::vector<unsigned char> chunk(std::min<size_t>(count, kLabelsPerChunk));
  targets->reserve(std::min<size_t>(count, kLabelsPerChunk));
  for (int64_t done = 0; done < count;) {
    const size_t n = std::min<size_t>(count - done, chunk.size());
    PST_RETURN_IF_ERROR(ReadExactly(file, path, "labels", chunk.data(), n));
    for (size_t i = 0; i < n; ++i) {
      if (chunk[i] >= kClasses) {
        return absl::InvalidArgumentError(absl::StrCat(path, " has label ", chunk[i],
                                                       " at index ", done + i,
                                                       "; labels must be 0-9"));
      }
      targets->push_back(chunk[i]);
    }
    done += n;
  }
  return absl::OkStatus();
}

// Fills `features` (already sized) with pixels / 255.
absl::Status ReadImages(gzFile file, const std::string& path, std::vector<float>* features) {
  std::array<float, 256> scale;
  for (int v = 0; v < 256; ++v) scale[v] = static_cast<float>(v) / 255.0f;
  std::vector<unsigned char> chunk(std::min(features->size(), kImagesPerChunk * kPixels));
  for (size_t done = 0; done < features->size();) {
    const size_t n = std::min(features->size() - done, chunk.size());
    PST_RETURN_IF_ERROR(ReadExactly(file, path, "pixels", chunk.data(), n));
    float* out = features->data() + done;
    for (size_t i = 0; i < n; ++i) out[i] = scale[chunk[i]];
    done += n;
  }
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
// libraries, and every process of a job must see the same data. mt19937_64
// itself is fully specified by the standard.
class Random {
 public:
  explicit Random(uint64_t seed) : rng_(Mix(seed)) {}
  // Uniform on [0, 1), from the top 53 bits.
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Box-Muller; log1p(-u) = log(1 - u) never sees 0 since u < 1.
  double Normal() {
    const double u1 = Uniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  // Unbiased integer in [0, bound): rejects the top partial block of 2^64.
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
  d.size = std::max<int64_t>(examples, 0);
  d.feature_dim = std::max(features, 0);
  d.target_dim = 1;
  d.features.resize(static_cast<size_t>(d.size) * d.feature_dim);
  d.targets.resize(d.size);
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
  if (absl::Status s = ReadHeader(images->get(), image_path, kImageMagic, 3, image_dims);
      !s.ok()) {
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
  int64_t count = label_count;
  if (limit > 0) count = std::min(count, limit);

  Dataset d;
  d.name = train ? "fashion_mnist_train" : "fashion_mnist_test";
  d.feature_dim = static_cast<int>(kPixels);
  d.target_dim = 1;
  d.num_classes = kClasses;
  // Labels first: they are small, and once read they vouch for `count`
  // before the large pixel buffer is allocated.
  if (absl::Status s = ReadLabels(labels->get(), label_path, count, &d.targets); !s.ok()) {
    return s;
  }
  d.features.resize(static_cast<size_t>(count) * kPixels);
  PST_RETURN_IF_ERROR(ReadImages(images->get(), image_path, &d.features));
  d.size = count;
  return d;
}

Dataset MakeQuadratic(int64_t examples, uint64_t seed) {
  Dataset d = Regression("quadratic", examples, 3);
  Random random(seed);
  for (int64_t i = 0; i < d.size; ++i) {
    const float x = static_cast<float>(random.Uniform(-1.0, 1.0));
    d.features[3 * i] = x * x;
    d.features[3 * i + 1] = x;
    d.features[3 * i + 2] = 1.0f;
    d.targets[i] = 5.0f * d.features[3 * i] + 3.0f;  // exactly linear in the features
  }
  return d;
}

Dataset MakeParabola(int64_t examples, uint64_t seed) {
  Dataset d = Regression("parabola", examples, 1);
  Random random(seed);
  for (int64_t i = 0; i < d.size; ++i) {
    const float x = static_cast<float>(random.Uniform(-2.0, 2.0));
    d.features[i] = x;
    d.targets[i] = x * x;
  }
  return d;
}

Dataset MakeLinearRegression(int64_t examples, int features, float noise, uint64_t seed) {
  Dataset d = Regression("linear_regression", examples, features);
  const int dim = d.feature_dim;
  // The true weights come from a stream of their own, so they depend on the
  // seed alone and not on how many examples are drawn.
  Random truth(seed);
  std::vector<double> w(dim);
  for (double& v : w) v = truth.Normal();
  const double b = truth.Normal();
  Random sample(Mix(seed) ^ 0x5EED);
  for (int64_t i = 0; i < d.size; ++i) {
    double y = b;
    for (int f = 0; f < dim; ++f) {
      const float x = static_cast<float>(sample.Normal());
      d.features[static_cast<size_t>(i) * dim + f] = x;
      y += w[f] * x;
    }
    d.targets[i] = static_cast<float>(y + noise * sample.Normal());
  }
  return d;
}

ShardSampler::ShardSampler(int64_t dataset_size, int rank, int num_workers, int batch_size,
                           uint64_t seed)
    : dataset_size_(std::max<int64_t>(dataset_size, 0)),
      rank_(rank),
      num_workers_(num_workers),
      batch_size_(batch_size),
      seed_(seed),
      // A nonsensical split (no workers, empty batches, a rank outside the
      // job) has no steps, so Batch never indexes past the permutation.
      steps_per_epoch_(num_workers > 0 && batch_size > 0 && rank >= 0 && rank < num_workers
                           ? dataset_size_ / (int64_t{num_workers} * batch_size)
                           : 0) {}

std::span<const int64_t> ShardSampler::Batch(int epoch, int64_t step) {
  // Outside the epoch's steps there is no batch: an empty span, not UB.
  if (epoch < 0 || step < 0 || step >= steps_per_epoch_) return {};
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
    const size_t row = static_cast<size_t>(indices[r]);
    std::memcpy(x + r * fx, data.features.data() + row * fx, fx * sizeof(float));
    std::memcpy(targets + r * ft, data.targets.data() + row * ft, ft * sizeof(float));
  }
}

}  // namespace pst
