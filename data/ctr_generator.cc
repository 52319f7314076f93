#include "data/ctr_generator.h"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numbers>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "data/auc.h"
#include "data/ctr_batch.h"
#include "data/ctr_formats.h"
#include "data/zipf.h"

namespace pst {
namespace {

constexpr double kMissingDense = 0.1;
constexpr int kDenseFieldBase = 1000;  // the dense coefficients' field numbers in Normal()
constexpr double kDenseScale = 0.15;

// A standard normal that is a function of (seed, field, key) alone.
double Normal(uint64_t seed, int field, uint64_t key) {
  const uint64_t a = CategoricalId(field, key ^ seed);
  const uint64_t b = CategoricalId(field, a);
  const double u1 = (static_cast<double>(a >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

class FileWriter {
 public:
  static absl::StatusOr<FileWriter> Open(const std::string& path) {
    const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
    errno = 0;
    gzFile file = gzopen(temporary.c_str(), absl::EndsWith(path, ".gz") ? "wb1" : "wT");
    if (file == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write ", temporary, ": ", std::strerror(errno)));
    }
    gzbuffer(file, 1 << 18);
    return FileWriter(path, temporary, file);
  }
  FileWriter(FileWriter&& other) noexcept
      : path_(std::move(other.path_)), temporary_(std::move(other.temporary_)),
        file_(std::exchange(other.file_, nullptr)) {}
  ~FileWriter() {
    if (file_ != nullptr) {
      gzclose(file_);
      std::remove(temporary_.c_str());
    }
  }
  absl::Status Write(const std::string& text) {
    if (gzwrite(file_, text.data(), static_cast<unsigned>(text.size())) !=
        static_cast<int>(text.size())) {
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", temporary_));
    }
    return absl::OkStatus();
  }
  absl::Status Commit() {
    const int closed = gzclose(std::exchange(file_, nullptr));
    if (closed != Z_OK || std::rename(temporary_.c_str(), path_.c_str()) != 0) {
      std::remove(temporary_.c_str());
      return absl::FailedPreconditionError(absl::StrCat("cannot write ", path_));
    }
    return absl::OkStatus();
  }

 private:
  FileWriter(std::string path, std::string temporary, gzFile file)
      : path_(std::move(path)), temporary_(std::move(temporary)), file_(file) {}
  std::string path_;
  std::string temporary_;
  gzFile file_;
};

class PlantedSampler {
 public:
  explicit PlantedSampler(const CtrGeneratorOptions& options) : options_(options) {
    for (int f = 0; f < kCriteoCategoricals; ++f) {
      const int64_t n = options.distinct.size() == 1 ? options.distinct[0] : options.distinct[f];
      fields_.emplace_back(n, options.zipf_exponent);
    }
  }

  // Appends one example's line to `out`; returns its click probability
  // and, in *label, its label.
  double Draw(std::mt19937_64& rng, std::string* out, int* label) const {
    double logit = options_.bias;
    std::string columns;
    for (int j = 0; j < kCriteoIntegers; ++j) {
      absl::StrAppend(&columns, "\t");
      if (Uniform(rng) < kMissingDense) continue;
      const double u1 = Uniform(rng) + 0x1.0p-54;
      const double u2 = Uniform(rng);
      const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      const int64_t count = static_cast<int64_t>(std::exp(1.0 + 0.25 * (j % 4) + normal));
      absl::StrAppend(&columns, count);
      logit += kDenseScale * Normal(options_.seed, kDenseFieldBase + j, 0) *
               std::log1p(static_cast<double>(count));
    }
    for (int f = 0; f < kCriteoCategoricals; ++f) {
      const int64_t rank = fields_[f].Draw(rng);
      const uint32_t hash = static_cast<uint32_t>(
          CategoricalId(f, options_.seed * 0x100000001B3ULL + static_cast<uint64_t>(rank)));
      absl::StrAppend(&columns, "\t", absl::Hex(hash, absl::kZeroPad8));
      logit += options_.weight_scale * Normal(options_.seed, f, hash) /
               (1.0 + static_cast<double>(rank - 1) / options_.signal_ranks);
    }
    const double p = 1.0 / (1.0 + std::exp(-logit));
    *label = Uniform(rng) < p ? 1 : 0;
    absl::StrAppend(out, *label, columns, "\n");
    return p;
  }

 private:
  const CtrGeneratorOptions& options_;
  std::vector<ZipfSampler> fields_;
};

absl::Status CheckOptions(const CtrGeneratorOptions& o) {
  if (o.train_examples < 1 || o.test_examples < 1) {
    return absl::InvalidArgumentError("the generator needs at least one train and test example");
  }
  if (o.distinct.size() != 1 && o.distinct.size() != kCriteoCategoricals) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distinct names ", o.distinct.size(), " fields; give one count or ", kCriteoCategoricals));
  }
  for (int64_t n : o.distinct) {
    if (n < 1) return absl::InvalidArgumentError("every field needs at least 1 distinct value");
  }
  if (!(o.zipf_exponent > 0.0) || !(o.signal_ranks > 0.0) || !std::isfinite(o.weight_scale) ||
      !std::isfinite(o.bias)) {
    return absl::InvalidArgumentError(
        "zipf_exponent and signal_ranks must be > 0, weight_scale and bias finite");
  }
  return absl::OkStatus();
}

// Writes `examples` lines drawn with `rng`; fills the click probabilities
// and labels when asked.
absl::Status WriteExamples(const PlantedSampler& sampler, int64_t examples, std::mt19937_64 rng,
                           const std::string& path, std::vector<float>* probabilities,
                           std::vector<float>* labels) {
  PST_ASSIGN_OR_RETURN(FileWriter writer, FileWriter::Open(path));
  std::string chunk;
  for (int64_t i = 0; i < examples; ++i) {
    int label = 0;
    const double p = sampler.Draw(rng, &chunk, &label);
    if (probabilities != nullptr) {
      probabilities->push_back(static_cast<float>(p));
      labels->push_back(static_cast<float>(label));
    }
    if (chunk.size() >= (size_t{1} << 18)) {
      PST_RETURN_IF_ERROR(writer.Write(chunk));
      chunk.clear();
    }
  }
  PST_RETURN_IF_ERROR(writer.Write(chunk));
  return writer.Commit();
}

}  // namespace

std::string OptionsFingerprint(const CtrGeneratorOptions& o) {
  return absl::StrCat("ctr-generator-1 train=", o.train_examples, " test=", o.test_examples,
                      " distinct=", absl::StrJoin(o.distinct, ","), " zipf=", o.zipf_exponent,
                      " signal_ranks=", o.signal_ranks, " weight_scale=", o.weight_scale,
                      " bias=", o.bias, " seed=", o.seed);
}

absl::StatusOr<PlantedModel> GenerateCtrFiles(const CtrGeneratorOptions& options,
                                              const std::string& train_path,
                                              const std::string& test_path) {
  PST_RETURN_IF_ERROR(CheckOptions(options));
  const PlantedSampler sampler(options);
  PST_RETURN_IF_ERROR(WriteExamples(sampler, options.train_examples,
                                    std::mt19937_64(options.seed), train_path, nullptr, nullptr));
  std::vector<float> probabilities;
  std::vector<float> labels;
  PST_RETURN_IF_ERROR(WriteExamples(sampler, options.test_examples,
                                    std::mt19937_64(~options.seed), test_path, &probabilities,
                                    &labels));
  PlantedModel planted;
  planted.test_auc = Auc(probabilities, labels);
  planted.test_logloss = LogLoss(probabilities, labels);
  double clicks = 0.0;
  for (float label : labels) clicks += label;
  planted.click_rate = clicks / static_cast<double>(labels.size());
  return planted;
}

std::string PlantedRecordPath(const std::string& test_path) {
  return absl::StrCat(test_path, ".planted");
}

absl::Status WritePlantedRecord(const std::string& test_path, const CtrGeneratorOptions& options,
                                const PlantedModel& planted) {
  const std::string path = PlantedRecordPath(test_path);
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
  {
    std::ofstream out(temporary);
    out.precision(17);
    out << OptionsFingerprint(options) << "\n"
        << planted.test_auc << " " << planted.test_logloss << " " << planted.click_rate << "\n";
    if (!out.flush()) return absl::FailedPreconditionError(absl::StrCat("cannot write ", path));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

std::optional<PlantedModel> ReadPlantedRecord(const std::string& test_path,
                                              const CtrGeneratorOptions& options) {
  std::ifstream in(PlantedRecordPath(test_path));
  std::string fingerprint;
  PlantedModel planted;
  if (!std::getline(in, fingerprint) || fingerprint != OptionsFingerprint(options)) {
    return std::nullopt;
  }
  if (!(in >> planted.test_auc >> planted.test_logloss >> planted.click_rate)) return std::nullopt;
  return planted;
}

}  // namespace pst
