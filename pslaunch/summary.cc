#include "pslaunch/summary.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "google/protobuf/util/json_util.h"
#include "pslaunch/tasks.h"

namespace pst {
namespace {

// A JSON number; null for NaN and infinities, which JSON cannot spell.
std::string JsonNumber(double value, const absl::FormatSpec<double>& format) {
  return std::isfinite(value) ? absl::StrFormat(format, value) : "null";
}

}  // namespace

absl::StatusOr<WorkerResult> ReadWorkerResult(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("worker result ", path, " is missing"));
  std::stringstream text;
  text << in.rdbuf();
  WorkerResult result;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (auto status = google::protobuf::util::JsonStringToMessage(text.str(), &result, options);
      !status.ok()) {
    // The parser's message quotes the text over several lines: keep the first.
    std::string reason(status.message().substr(0, status.message().find('\n')));
    return absl::DataLossError(
        absl::StrCat("worker result ", path, " is not a valid result: ", reason));
  }
  return result;
}

absl::StatusOr<RunSummary> Summarize(const JobConfig& config, const std::string& dir,
                                     absl::Time start, const std::set<int>& abandoned) {
  RunSummary summary;
  summary.set_mode(ModeName(config.training().mode()));
  summary.set_workers(config.cluster().workers());
  // A script's own loop decides its epochs: the chief's result says them,
  // or they are unknown.
  const bool script = !config.cluster().worker_command().empty();
  summary.set_epochs(script ? 0 : config.training().epochs());
  std::set<int> missing = abandoned;
  int64_t samples = 0;
  double longest = 0.0;
  for (int i = 0; i < config.cluster().workers(); ++i) {
    absl::StatusOr<WorkerResult> result = ReadWorkerResult(WorkerResultPath(dir, i));
    if (!result.ok() && missing.count(i) > 0) continue;
    if (!result.ok()) return result.status();
    if (i == 0) missing.insert(result->missing_workers().begin(), result->missing_workers().end());
    samples += result->samples();
    longest = std::max(longest, result->train_seconds());
    if (i == 0) {  // the chief
      summary.set_steps(result->final_version());
      if (result->epochs() > 0) summary.set_epochs(result->epochs());
      // Regression jobs have no accuracy: NaN prints as null.
      summary.set_test_accuracy(result->has_test_accuracy()
                                    ? result->test_accuracy()
                                    : std::numeric_limits<double>::quiet_NaN());
      summary.set_final_loss(result->final_loss());
      summary.set_devices(result->devices());
      if (result->has_test_auc()) {
        summary.set_has_test_auc(true);
        summary.set_test_auc(result->test_auc());
        summary.set_test_logloss(result->test_logloss());
      }
    }
  }
  // No worker counted its samples (a script whose data comes from no
  // prepared loader): the speed is unknown, printed as null, not 0.
  summary.set_train_samples_per_sec(
      samples > 0 && longest > 0 ? samples / longest : std::numeric_limits<double>::quiet_NaN());
  summary.set_wall_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  summary.mutable_missing_workers()->Add(missing.begin(), missing.end());
  return summary;
}

std::string SummaryLine(const RunSummary& summary) {
  // Only a run that lost workers has the last key.
  const std::string missing =
      summary.missing_workers().empty()
          ? ""
          : absl::StrCat(",\"missing_workers\":[", absl::StrJoin(summary.missing_workers(), ","),
                         "]");
  // Only a click model's run has these.
  const std::string auc =
      summary.has_test_auc()
          ? absl::StrCat(",\"test_auc\":", JsonNumber(summary.test_auc(), "%.4f"),
                         ",\"test_logloss\":", JsonNumber(summary.test_logloss(), "%.4f"))
          : "";
  return absl::StrFormat(
      "{\"mode\":\"%s\",\"workers\":%d,\"epochs\":%s,\"steps\":%d,\"test_accuracy\":%s%s,"
      "\"final_loss\":%s,\"train_samples_per_sec\":%s,\"wall_seconds\":%s,\"devices\":\"%s\"%s}",
      summary.mode(), summary.workers(),
      summary.epochs() > 0 ? absl::StrCat(summary.epochs()) : "null", summary.steps(),
      JsonNumber(summary.test_accuracy(), "%.4f"), auc, JsonNumber(summary.final_loss(), "%.6g"),
      JsonNumber(summary.train_samples_per_sec(), "%.1f"),
      JsonNumber(summary.wall_seconds(), "%.2f"), summary.devices(), missing);
}

}  // namespace pst
