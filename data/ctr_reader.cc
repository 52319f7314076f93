#include "data/ctr_reader.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pst {
namespace {

absl::Status ParseLine(CtrFormat format, absl::string_view line, CtrBatch* batch) {
  return format == CtrFormat::kCriteo ? ParseCriteoLine(line, batch)
                                      : ParseLibsvmLine(line, batch);
}

absl::Status Malformed(const LineReader& lines, const absl::Status& parsed) {
  return absl::InvalidArgumentError(
      absl::StrCat(lines.path(), ":", lines.line_number(), ": ", parsed.message(),
                   " (training.dataset.ctr.skip_malformed_lines skips and counts such lines)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CtrReader>> CtrReader::Open(const std::string& path,
                                                           const CtrReaderOptions& options) {
  if (options.num_workers < 1 || options.worker < 0 || options.worker >= options.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", options.worker, " is outside [0, ",
                                                   options.num_workers, ")"));
  }
  PST_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, LineReader::Open(path));
  return std::unique_ptr<CtrReader>(new CtrReader(std::move(lines), options));
}

absl::Status CtrReader::Rewind() { return lines_->Rewind(); }

absl::StatusOr<int> CtrReader::Read(int max_examples, CtrBatch* batch) {
  int read = 0;
  absl::string_view line;
  while (read < max_examples) {
    PST_ASSIGN_OR_RETURN(bool more, lines_->Next(&line));
    if (!more) break;
    if ((lines_->line_number() - 1) % options_.num_workers != options_.worker) continue;
    absl::Status parsed = ParseLine(options_.format, line, batch);
    if (parsed.ok()) {
      ++read;
      continue;
    }
    if (options_.malformed == MalformedLines::kFail) return Malformed(*lines_, parsed);
    if (skipped_++ == 0) {
      first_skip_ = absl::StrCat(lines_->path(), ":", lines_->line_number(), ": ",
                                 parsed.message());
    }
  }
  return read;
}

absl::StatusOr<std::vector<int64_t>> CountShares(const std::string& path,
                                                 const CtrReaderOptions& options) {
  if (options.num_workers < 1) return absl::InvalidArgumentError("no workers to count for");
  PST_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, LineReader::Open(path));
  std::vector<int64_t> counts(options.num_workers, 0);
  CtrBatch batch = EmptyBatchFor(options.format);
  absl::string_view line;
  while (true) {
    PST_ASSIGN_OR_RETURN(bool more, lines->Next(&line));
    if (!more) break;
    absl::Status parsed = ParseLine(options.format, line, &batch);
    if (parsed.ok()) {
      ++counts[(lines->line_number() - 1) % options.num_workers];
    } else if (options.malformed == MalformedLines::kFail) {
      return Malformed(*lines, parsed);
    }
    batch.Clear();
  }
  return counts;
}

}  // namespace pst
