#include "common/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// flock(fd, operation), again when a signal interrupts it; the errno of
// its failure, or 0.
int Flock(int fd, int operation) {
  while (flock(fd, operation) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

}  // namespace

absl::StatusOr<FileLock> FileLock::Wait(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the lock file ", path, ": ", std::strerror(errno)));
  }
  if (const int error = Flock(fd, LOCK_EX); error != 0) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot lock ", path, ": ", std::strerror(error)));
  }
  return FileLock(fd);
}

absl::StatusOr<FileLock> FileLock::HoldDirectory(const std::string& dir, absl::string_view what) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", what, " ", dir, ": ", std::strerror(errno)));
  }
  const int error = Flock(fd, LOCK_EX | LOCK_NB);
  if (error == 0) return FileLock(fd);
  close(fd);
  if (error == EWOULDBLOCK) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " ", dir,
        " is in use by another live process (another job's PS given the same folder, or this "
        "shard started twice): give each PS a folder of its own, or stop the other process"));
  }
  if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL) {
    // A filesystem without locks (some network and FUSE mounts): the lock
    // guards against a mistake, and refusing to start there would turn a
    // folder that works into one that does not.
    spdlog::warn("{} {} cannot be locked ({}): used without the guard against a second process",
                 std::string(what), dir, std::strerror(error));
    return FileLock(-1);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("cannot lock ", what, " ", dir, ": ", std::strerror(error)));
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor drops the flock
}

}  // namespace pst
