// The run report: one self-contained HTML page (inline SVG, no script, no
// network) with the training-loss curve of every worker and the chief's
// test accuracy per epoch, for one run or several drawn together (sync next
// to async). pslaunch --report writes it with the run's RunRecord as JSON
// beside it; psreport merges the JSON of several runs into one page.
#ifndef PST_PSLAUNCH_REPORT_H_
#define PST_PSLAUNCH_REPORT_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config.pb.h"
#include "result.pb.h"

namespace pst {

// What the summary line calls final_loss (RunSummary.final_loss), as the page explains it.
inline constexpr char kFinalLoss[] =
    "the chief's (worker:0's) mean training loss over its last epoch, as the summary line's "
    "final_loss";

// The training settings a run's label names: "adam lr 0.001, batch 64".
std::string DescribeTraining(const TrainingConfig& training);

// What a job's label names: a script's command (cluster.worker_command:
// its optimizer and batch are the script's own, not the config's), cut to
// kMaxCommandInLabel characters; else DescribeTraining's.
inline constexpr size_t kMaxCommandInLabel = 60;
std::string DescribeJob(const JobConfig& config);

// A run's record from its summary and its workers' results, labelled
// "<mode>, <N> worker(s)[, <training>]" (training: DescribeJob's).
RunRecord MakeRunRecord(const RunSummary& summary, std::vector<WorkerResult> workers,
                        const std::string& training = "");

// Labels that name two runs alike get the file each record came from
// (`sources`, in order), then a number where that is not enough, so that
// every run of a psreport page has its own name.
void MakeLabelsDistinct(std::vector<RunRecord>& runs, const std::vector<std::string>& sources);

// The page for `runs`, in order.
std::string RenderReport(const std::vector<RunRecord>& runs);

// The JSON file kept beside a report page: "run.html" -> "run.json".
std::string RecordPathFor(const std::string& report_path);

absl::Status WriteRunRecord(const RunRecord& record, const std::string& path);
// NotFound or DataLoss, naming the file, when it is missing or not a record.
absl::StatusOr<RunRecord> ReadRunRecord(const std::string& path);
absl::Status WriteTextFile(const std::string& path, const std::string& text);

// One line of a chart: (x, y) points.
struct Series {
  std::string name;
  std::string color;   // CSS color
  std::string dash;    // SVG stroke-dasharray, empty = solid
  std::vector<std::pair<double, double>> points;
};

// An SVG line chart with axes, ticks, title and legend; `integer_x` keeps
// x ticks on whole numbers (epochs), `fraction_y` keeps the y axis within
// [0, 1] (accuracy).
std::string LineChart(const std::string& title, const std::string& x_label,
                      const std::string& y_label, const std::vector<Series>& series,
                      bool integer_x = false, bool fraction_y = false);

// Round tick values covering [lo, hi]: steps of 1, 2 or 5 x 10^k, about
// `count`, and no finer than `min_step`.
std::vector<double> NiceTicks(double lo, double hi, int count, double min_step = 0);

}  // namespace pst

#endif  // PST_PSLAUNCH_REPORT_H_
