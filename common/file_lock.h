// An exclusive flock(2), held while the object lives.
//
// The kernel drops it when the holder's descriptor closes, and so when the
// process ends however it ends (kill -9 included): a restarted process
// takes the lock at once, with no stale lock file to clear. flock locks an
// open file description, so two holders in one process exclude each other
// as two processes do.
//
// Two uses. Wait: processes that must take turns at a file (the workers
// that generate a job's data) wait for each other. HoldDirectory: a
// directory one process writes (a PS's checkpoint folder, a disk tier's
// database) is held by one holder at a time, so that a second process
// pointed at it (another job's PS given the same folder, or one shard
// started twice) is refused instead of wiping or interleaving with the
// files the first is writing.
#ifndef PST_COMMON_FILE_LOCK_H_
#define PST_COMMON_FILE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pst {

class FileLock {
 public:
  // Opens `path` (created if missing) and waits until it holds it.
  // FailedPrecondition naming `path` if it cannot be opened or locked.
  static absl::StatusOr<FileLock> Wait(const std::string& path);

  // Locks `dir`, which must exist, without waiting. FailedPrecondition
  // naming `what` and `dir` when another holder has it; InvalidArgument
  // when it cannot be opened as a directory. On a filesystem that cannot
  // lock (ENOLCK, EOPNOTSUPP: some network and FUSE mounts) the lock holds
  // nothing, and a warning names the directory.
  static absl::StatusOr<FileLock> HoldDirectory(const std::string& dir, absl::string_view what);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  // Lets go.
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace pst

#endif  // PST_COMMON_FILE_LOCK_H_
