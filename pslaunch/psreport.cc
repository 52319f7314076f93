// psreport: draws several runs on one page, e.g. SYNC next to ASYNC.
//   pslaunch --mode=sync  --report=sync.html
//   pslaunch --mode=async --report=async.html
//   psreport --out=compare.html sync.json async.json
// Each JSON file is the run record pslaunch --report keeps beside its page.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/exit.h"
#include "common/flags.h"
#include "pslaunch/report.h"

ABSL_FLAG(std::string, out, "compare.html", "The HTML page to write.");
ABSL_FLAG(std::vector<std::string>, labels, {},
          "Names for the runs in the legend, comma-separated, in argument order (default: "
          "\"<mode>, <N> workers, <optimizer> lr <rate>, batch <size>\" from each record, with "
          "the file's name added where two records carry the same label).");

namespace {
constexpr char kProgram[] = "psreport";
}

int main(int argc, char** argv) {
  std::vector<char*> args = pst::ParseCommandLineFlags(
      argc, argv,
      "Draws the loss, accuracy, throughput and staleness curves of several runs on one "
      "self-contained HTML page.\n"
      "Usage: psreport --out=compare.html sync.json async.json [more.json...]\n"
      "The JSON files are the run records that pslaunch --report=NAME.html writes as NAME.json.",
      pst::kPsreport);
  if (args.size() < 2) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(
        "name at least one run record: psreport --out=compare.html sync.json async.json"));
  }
  const std::vector<std::string> labels = absl::GetFlag(FLAGS_labels);
  if (!labels.empty() && labels.size() != args.size() - 1) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(absl::StrCat(
        "--labels names ", labels.size(), " run(s) but ", args.size() - 1, " record(s) are given")));
  }
  std::vector<pst::RunRecord> runs;
  for (size_t i = 1; i < args.size(); ++i) {
    absl::StatusOr<pst::RunRecord> record = pst::ReadRunRecord(args[i]);
    if (!record.ok()) pst::ExitWithError(kProgram, record.status());
    if (!labels.empty()) record->set_label(labels[i - 1]);
    runs.push_back(*std::move(record));
  }
  if (labels.empty()) {
    pst::MakeLabelsDistinct(runs, std::vector<std::string>(args.begin() + 1, args.end()));
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (absl::Status s = pst::WriteTextFile(out, pst::RenderReport(runs)); !s.ok()) {
    pst::ExitWithError(kProgram, s);
  }
  std::printf("%s\n", out.c_str());
  return 0;
}
