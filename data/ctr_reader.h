// Streams one worker's share of a click-through-rate file (Criteo TSV or
// libsvm, plain or gzip) as batches, one buffer of the file in memory at a
// time.
//
// Split: line i of the file (0-based, every line counted, malformed ones
// too) belongs to worker i % num_workers, so the shares are disjoint, cover
// the file, and need no index; each worker reads past the others' lines
// without parsing them.
//
// Malformed lines either end the read with InvalidArgument naming the file,
// the line and what is wrong (kFail), or are skipped and counted (kSkip).
#ifndef PST_DATA_CTR_READER_H_
#define PST_DATA_CTR_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/ctr_batch.h"
#include "data/ctr_formats.h"
#include "data/line_reader.h"

namespace pst {

enum class MalformedLines { kFail, kSkip };

struct CtrReaderOptions {
  CtrFormat format = CtrFormat::kCriteo;
  int worker = 0;
  int num_workers = 1;
  MalformedLines malformed = MalformedLines::kFail;
};

class CtrReader {
 public:
  // NotFound when the file cannot be opened; InvalidArgument for a worker
  // outside [0, num_workers).
  static absl::StatusOr<std::unique_ptr<CtrReader>> Open(const std::string& path,
                                                         const CtrReaderOptions& options);

  // Appends up to `max_examples` of this worker's examples to `batch`
  // (whose shape must be EmptyBatchFor(format)); returns how many, fewer
  // only at the end of the file.
  absl::StatusOr<int> Read(int max_examples, CtrBatch* batch);

  // Starts again at the top of the file (the next epoch).
  absl::Status Rewind();

  // Malformed lines of this worker's share skipped so far (kSkip), and the
  // first one's message.
  int64_t skipped() const { return skipped_; }
  const std::string& first_skip() const { return first_skip_; }

 private:
  CtrReader(std::unique_ptr<LineReader> lines, const CtrReaderOptions& options)
      : lines_(std::move(lines)), options_(options) {}

  std::unique_ptr<LineReader> lines_;
  CtrReaderOptions options_;
  int64_t skipped_ = 0;
  std::string first_skip_;
};

// How many examples each of `options.num_workers` workers' shares holds
// (malformed lines as options.malformed says), in one streamed pass; the
// errors as CtrReader's.
absl::StatusOr<std::vector<int64_t>> CountShares(const std::string& path,
                                                 const CtrReaderOptions& options);

}  // namespace pst

#endif  // PST_DATA_CTR_READER_H_
