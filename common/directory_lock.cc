#include "common/directory_lock.h"

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

absl::StatusOr<DirectoryLock> DirectoryLock::Acquire(const std::string& dir,
                                                     absl::string_view what) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open ", what, " ", dir, ": ", std::strerror(errno)));
  }
  int locked;
  do {
    locked = flock(fd, LOCK_EX | LOCK_NB);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    const int error = errno;
    close(fd);
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " ", dir,
          " is in use by another live process (another job's PS given the same folder, or this "
          "shard started twice): give each PS a folder of its own, or stop the other process"));
    }
    if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL) {
      // A filesystem without locks (some network and FUSE mounts): the
      // lock guards against a mistake, and refusing to start there would
      // turn a folder that works into one that does not.
      spdlog::warn("{} {} cannot be locked ({}): used without the guard against a second process",
                   std::string(what), dir, std::strerror(error));
      return DirectoryLock(-1);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot lock ", what, " ", dir, ": ", std::strerror(error)));
  }
  return DirectoryLock(fd);
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) close(fd_);  // closing the last descriptor drops the flock
}

}  // namespace pst
