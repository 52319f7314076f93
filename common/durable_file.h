// Files written whole and in place of nothing else: a reader sees the old
// contents or the new, never a part, and a link, FIFO or other file put
// where the file (or its temporary) goes is refused, not followed: a
// directory another user can write to cannot turn a write into one of
// that user's choosing.
#ifndef PST_COMMON_DURABLE_FILE_H_
#define PST_COMMON_DURABLE_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pst {

// Writes `contents` to `path`.tmp (refusing a link or a non-regular file
// there), fsyncs it, renames it over `path` and fsyncs the directory.
// Unavailable, naming the step and the path, on failure; the temporary
// file is then removed, so a full disk is not filled further. The file is
// created with permission bits `mode` (less the umask): 0600 for what
// only its owner may read, such as a checkpoint of the model.
absl::Status WriteFileDurably(const std::string& path, const std::string& contents,
                              mode_t mode = 0644);

// The temporary file of the streaming form below, as its writer sees it.
class DurableFileWriter {
 public:
  // Appends `bytes`. Unavailable, naming the file, on failure.
  absl::Status Append(std::string_view bytes);
  // Overwrites bytes already appended from `offset` on (a header whose
  // figures are known only at the end).
  absl::Status WriteAt(uint64_t offset, std::string_view bytes);

 private:
  friend absl::Status WriteFileDurably(const std::string&,
                                       absl::FunctionRef<absl::Status(DurableFileWriter&)>, mode_t);
  DurableFileWriter(int fd, const std::string& temp) : fd_(fd), temp_(temp) {}
  const int fd_;
  const std::string& temp_;
};

// The same, with contents that `write` streams into the temporary file, so
// that they need not be in memory whole. An error `write` returns fails the
// write as a failed append would (the temporary file removed).
absl::Status WriteFileDurably(const std::string& path,
                              absl::FunctionRef<absl::Status(DurableFileWriter&)> write,
                              mode_t mode = 0644);

// Opens `path` for appending, creating it (mode 0644) if missing; refuses
// a link or a non-regular file there. The descriptor, or Unavailable.
absl::StatusOr<int> OpenForAppend(const std::string& path);

}  // namespace pst

#endif  // PST_COMMON_DURABLE_FILE_H_
