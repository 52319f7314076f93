// A directory one process writes: held by one holder at a time, so that a
// second process pointed at it (another job's PS given the same folder, or
// one shard started twice) is refused instead of wiping or interleaving
// with the files the first is writing.
//
// The lock is an exclusive flock(2) on the directory itself. The kernel
// drops it when the holder's descriptor closes, and so when the process
// ends however it ends (kill -9 included): a restarted process takes the
// directory over at once, with no stale lock file to clear. flock locks an
// open file description, so two holders in one process exclude each other
// as two processes do.
#ifndef PST_COMMON_DIRECTORY_LOCK_H_
#define PST_COMMON_DIRECTORY_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pst {

class DirectoryLock {
 public:
  // Locks `dir`, which must exist. FailedPrecondition naming `what` and
  // `dir` when another holder has it; InvalidArgument when it cannot be
  // opened as a directory. On a filesystem that cannot lock (ENOLCK,
  // EOPNOTSUPP: some network and FUSE mounts) the lock holds nothing, and
  // a warning names the directory.
  static absl::StatusOr<DirectoryLock> Acquire(const std::string& dir, absl::string_view what);

  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  // Lets go of the directory.
  ~DirectoryLock();

 private:
  explicit DirectoryLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace pst

#endif  // PST_COMMON_DIRECTORY_LOCK_H_
