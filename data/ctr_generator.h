// Writes Criteo-format files (data/ctr_formats.h) drawn from a planted
// logistic model, so that the best AUC any model can reach on them is known.
//
// The planted model, all of it a function of the seed:
//  - Field f (of 26) draws rank r in [1, distinct_f] from a Zipf law
//    (data/zipf.h); the column holds hash(seed, f, r) as 8 hex digits, as
//    Criteo's do (ranks whose hashes collide share a weight).
//  - Each (field, hash) has weight w = weight_scale * z / (1 + (r - 1) /
//    signal_ranks), z a standard normal drawn from the hash: the weight
//    lives in the ranks the data shows often enough to learn, and a long
//    tail of rare ids carries little.
//  - Integer column j is missing with probability 0.1, else a log-normal
//    count x; it adds a_j log(1 + x), a_j normal.
//  - P(click) = sigmoid(bias + sum of the weights + sum of the dense terms);
//    the label is drawn from it.
// The planted model's own AUC and log-loss on the test file are what it
// scores there with the true probabilities.
#ifndef PST_DATA_CTR_GENERATOR_H_
#define PST_DATA_CTR_GENERATOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pst {

struct CtrGeneratorOptions {
  int64_t train_examples = 200000;
  int64_t test_examples = 50000;
  // Distinct values per field: one number for every field, or one per field.
  std::vector<int64_t> distinct = {100000};
  double zipf_exponent = 1.1;
  double signal_ranks = 100.0;
  double weight_scale = 0.4;
  double bias = -1.2;
  uint64_t seed = 1;
};

// What the planted model scores on the test file.
struct PlantedModel {
  double test_auc = 0.0;
  double test_logloss = 0.0;
  double click_rate = 0.0;  // of the test file
};

// Writes both files (gzip when a path ends in ".gz"), each to a temporary
// name first and renamed into place, so a reader never sees half a file.
// InvalidArgument for bad options; an error naming the file when one
// cannot be written.
absl::StatusOr<PlantedModel> GenerateCtrFiles(const CtrGeneratorOptions& options,
                                              const std::string& train_path,
                                              const std::string& test_path);

// One line naming every option, so that files generated with other options
// are told apart (see the .planted record below).
std::string OptionsFingerprint(const CtrGeneratorOptions& options);

// The record kept beside the test file ("<test_path>.planted"): the
// options' fingerprint and the planted model's scores.
std::string PlantedRecordPath(const std::string& test_path);
absl::Status WritePlantedRecord(const std::string& test_path, const CtrGeneratorOptions& options,
                                const PlantedModel& planted);
// The record, if there is one for these options; nullopt when it is
// missing or names other options.
std::optional<PlantedModel> ReadPlantedRecord(const std::string& test_path,
                                              const CtrGeneratorOptions& options);

}  // namespace pst

#endif  // PST_DATA_CTR_GENERATOR_H_
