// The summary of a finished run that pslaunch prints as the last line of
// stdout, from the result file each worker wrote.
#ifndef PST_PSLAUNCH_SUMMARY_H_
#define PST_PSLAUNCH_SUMMARY_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config.pb.h"
#include "result.pb.h"

namespace pst {

// A worker's result file; NotFound when it is missing, DataLoss naming the
// file when it is not a result.
absl::StatusOr<WorkerResult> ReadWorkerResult(const std::string& path);

// The run from the workers' results in `dir` (WorkerResultPath), the chief's
// for the model's figures. `abandoned`: worker indices pslaunch gave up on
// (no restarts left); their results are missing, and the summary names
// them.
absl::StatusOr<RunSummary> Summarize(const JobConfig& config, const std::string& dir,
                                     absl::Time start, const std::set<int>& abandoned);

// The summary as one line of JSON. Written by hand so that the keys keep
// the documented order and 64-bit integers print as numbers (the protobuf
// printer quotes them).
std::string SummaryLine(const RunSummary& summary);

}  // namespace pst

#endif  // PST_PSLAUNCH_SUMMARY_H_
