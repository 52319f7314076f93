// Reads a text file line by line, plain or gzip (zlib reads either
// transparently), holding one buffer, never the whole file.
#ifndef PST_DATA_LINE_READER_H_
#define PST_DATA_LINE_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pst {

class LineReader {
 public:
  // Lines longer than this are refused: a file with no newlines (binary
  // data, a wrong path) must not grow the buffer without bound.
  static constexpr size_t kMaxLineBytes = size_t{1} << 20;

  // NotFound naming `path` when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, without its "\n" (and "\r\n"), valid until the next call;
  // false at the end of the file. InvalidArgument naming the file and line
  // for a corrupt or truncated gzip stream or a line over kMaxLineBytes.
  absl::StatusOr<bool> Next(absl::string_view* line);

  // Starts again at the first line.
  absl::Status Rewind();

  // 1-based number of the line Next last returned.
  int64_t line_number() const { return line_number_; }
  const std::string& path() const { return path_; }

 private:
  LineReader(std::string path, void* file);
  // Reads more bytes behind the unread ones; false at the end of the file.
  absl::StatusOr<bool> Fill();

  std::string path_;
  void* file_;  // gzFile
  std::vector<char> buffer_;
  size_t begin_ = 0;  // first unread byte
  size_t end_ = 0;    // one past the last byte read
  bool eof_ = false;
  int64_t line_number_ = 0;
};

}  // namespace pst

#endif  // PST_DATA_LINE_READER_H_
