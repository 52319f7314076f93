// ctr_datagen: writes Criteo-format train and test files drawn from a
// planted logistic model (data/ctr_generator.h) and prints what the planted
// model itself scores on the test file, the best AUC a trained model can
// be expected to reach.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "data/ctr_generator.h"

ABSL_FLAG(std::string, train_file, "ctr_train.tsv", "Where the training examples go (.gz: gzip)");
ABSL_FLAG(std::string, test_file, "ctr_test.tsv", "Where the test examples go (.gz: gzip)");
ABSL_FLAG(int64_t, train_examples, 200000, "Training examples");
ABSL_FLAG(int64_t, test_examples, 50000, "Test examples");
ABSL_FLAG(std::string, distinct, "100000",
          "Distinct values per categorical field: one count, or 26 comma-separated");
ABSL_FLAG(double, zipf_exponent, 1.1, "Exponent of the Zipf law of each field's values");
ABSL_FLAG(double, signal_ranks, 100.0, "Weights shrink as 1 / (1 + (rank - 1) / signal_ranks)");
ABSL_FLAG(double, weight_scale, 0.4, "Standard deviation of a head value's weight");
ABSL_FLAG(double, bias, -1.2, "The planted model's bias (sets the click rate)");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the planted model and of the examples");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes Criteo-format click data from a planted logistic model and prints the planted "
      "model's own test AUC and log-loss.");
  absl::ParseCommandLine(argc, argv);
  pst::CtrGeneratorOptions options;
  options.train_examples = absl::GetFlag(FLAGS_train_examples);
  options.test_examples = absl::GetFlag(FLAGS_test_examples);
  options.distinct.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_distinct), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) {
      std::fprintf(stderr, "ctr_datagen: --distinct holds \"%s\", not a count\n",
                   std::string(part).c_str());
      return 2;
    }
    options.distinct.push_back(n);
  }
  options.zipf_exponent = absl::GetFlag(FLAGS_zipf_exponent);
  options.signal_ranks = absl::GetFlag(FLAGS_signal_ranks);
  options.weight_scale = absl::GetFlag(FLAGS_weight_scale);
  options.bias = absl::GetFlag(FLAGS_bias);
  options.seed = absl::GetFlag(FLAGS_seed);
  const std::string test = absl::GetFlag(FLAGS_test_file);
  absl::StatusOr<pst::PlantedModel> planted =
      pst::GenerateCtrFiles(options, absl::GetFlag(FLAGS_train_file), test);
  if (planted.ok()) {
    if (absl::Status s = pst::WritePlantedRecord(test, options, *planted); !s.ok()) {
      planted = s;
    }
  }
  if (!planted.ok()) {
    std::fprintf(stderr, "ctr_datagen: %s\n", std::string(planted.status().message()).c_str());
    return planted.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("planted model on %s: test_auc %.4f test_logloss %.4f click_rate %.4f\n",
              test.c_str(), planted->test_auc, planted->test_logloss, planted->click_rate);
  return 0;
}
