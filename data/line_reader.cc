#include "data/line_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

constexpr size_t kReadBytes = size_t{1} << 18;

gzFile Gz(void* file) { return static_cast<gzFile>(file); }

}  // namespace

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    const int error = errno;
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ",
                                            error != 0 ? std::strerror(error) : "out of memory"));
  }
  gzbuffer(file, kReadBytes);
  return std::unique_ptr<LineReader>(new LineReader(path, file));
}

LineReader::LineReader(std::string path, void* file)
    : path_(std::move(path)), file_(file), buffer_(kReadBytes) {}

LineReader::~LineReader() { gzclose(Gz(file_)); }

absl::Status LineReader::Rewind() {
  if (gzrewind(Gz(file_)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot rewind ", path_));
  }
  begin_ = end_ = 0;
  eof_ = false;
  line_number_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<bool> LineReader::Fill() {
  if (eof_) return false;
  if (begin_ > 0) {  // keep the unread bytes, at the front
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffer_.size() - end_ < kReadBytes / 2) {
    if (end_ >= kMaxLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_number_ + 1,
                                                     ": line longer than ", kMaxLineBytes,
                                                     " bytes; is this a text file?"));
    }
    buffer_.resize(buffer_.size() * 2);
  }
  const int got = gzread(Gz(file_), buffer_.data() + end_,
                         static_cast<unsigned>(buffer_.size() - end_));
  if (got < 0) {
    int code = Z_OK;
    const char* message = gzerror(Gz(file_), &code);
    return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_number_ + 1,
                                                   ": corrupt or unreadable: ", message));
  }
  if (got == 0) {
    int code = Z_OK;
    const char* message = gzerror(Gz(file_), &code);
    if (code != Z_OK) {  // a gzip stream cut short ends as "unexpected end of file"
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":", line_number_ + 1, ": corrupt or truncated: ", message));
    }
    eof_ = true;
    return false;
  }
  end_ += static_cast<size_t>(got);
  return true;
}

absl::StatusOr<bool> LineReader::Next(absl::string_view* line) {
  size_t scanned = begin_;
  while (true) {
    const void* newline = std::memchr(buffer_.data() + scanned, '\n', end_ - scanned);
    if (newline != nullptr) {
      const size_t at = static_cast<const char*>(newline) - buffer_.data();
      size_t length = at - begin_;
      if (length > 0 && buffer_[at - 1] == '\r') --length;
      *line = absl::string_view(buffer_.data() + begin_, length);
      begin_ = at + 1;
      ++line_number_;
      return true;
    }
    const size_t unread = end_ - begin_;
    absl::StatusOr<bool> more = Fill();
    if (!more.ok()) return more.status();
    if (!*more) {
      if (end_ == begin_) return false;
      // The last line has no newline.
      size_t length = end_ - begin_;
      if (buffer_[end_ - 1] == '\r') --length;
      *line = absl::string_view(buffer_.data() + begin_, length);
      begin_ = end_;
      ++line_number_;
      return true;
    }
    scanned = begin_ + unread;
  }
}

}  // namespace pst
