#include "worker/training/ctr_data.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_lock.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

bool Exists(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::exists(path, ignored);
}

}  // namespace

CtrGeneratorOptions GeneratorOptionsFrom(const CtrDataConfig& data, uint64_t job_seed) {
  const CtrGeneratorConfig& g = data.generate();
  CtrGeneratorOptions options;
  if (g.train_examples() > 0) options.train_examples = g.train_examples();
  if (g.test_examples() > 0) options.test_examples = g.test_examples();
  if (g.distinct_size() > 0) options.distinct.assign(g.distinct().begin(), g.distinct().end());
  if (g.zipf_exponent() > 0) options.zipf_exponent = g.zipf_exponent();
  if (g.signal_ranks() > 0) options.signal_ranks = g.signal_ranks();
  if (g.weight_scale() > 0) options.weight_scale = g.weight_scale();
  options.seed = g.seed() != 0 ? g.seed() : job_seed;
  return options;
}

CtrReaderOptions ReaderOptionsFrom(const CtrDataConfig& data, int rank, int workers) {
  CtrReaderOptions options;
  options.format = data.format() == LIBSVM ? CtrFormat::kLibsvm : CtrFormat::kCriteo;
  options.worker = rank;
  options.num_workers = workers;
  options.malformed = data.skip_malformed_lines() ? MalformedLines::kSkip : MalformedLines::kFail;
  return options;
}

absl::StatusOr<std::optional<PlantedModel>> PrepareCtrFiles(const TrainingConfig& training) {
  const CtrDataConfig& data = training.dataset().ctr();
  if (!data.has_generate()) {
    for (const std::string& path : {data.train_file(), data.test_file()}) {
      if (!Exists(path)) {
        return absl::NotFoundError(absl::StrCat(
            path, " does not exist; name an existing file in training.dataset.ctr, or set "
            "training.dataset.ctr.generate to write one from a planted model"));
      }
    }
    return std::nullopt;
  }
  const CtrGeneratorOptions options = GeneratorOptionsFrom(data, training.seed());
  for (const std::string& path : {data.train_file(), data.test_file()}) {
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::error_code error;
    if (!dir.empty()) std::filesystem::create_directories(dir, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", dir.string(), " for ", path, ": ", error.message()));
    }
  }
  absl::StatusOr<FileLock> lock = FileLock::Wait(absl::StrCat(data.test_file(), ".lock"));
  if (!lock.ok()) return lock.status();
  if (std::optional<PlantedModel> planted = ReadPlantedRecord(data.test_file(), options);
      planted.has_value() && Exists(data.train_file()) && Exists(data.test_file())) {
    return planted;
  }
  spdlog::info("generating {} and {} from a planted model ({})", data.train_file(),
               data.test_file(), OptionsFingerprint(options));
  PST_ASSIGN_OR_RETURN(PlantedModel planted,
                       GenerateCtrFiles(options, data.train_file(), data.test_file()));
  PST_RETURN_IF_ERROR(WritePlantedRecord(data.test_file(), options, planted));
  return std::optional<PlantedModel>(planted);
}

}  // namespace pst
