#include "common/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status WriteFileDurably(const std::string& path, const std::string& contents,
                              mode_t mode) {
  const std::string temp = path + ".tmp";
  // A new file, made here (O_EXCL): whatever was left or put in the
  // temporary file's place (a link, a hard link to another file, a FIFO)
  // is removed first, and one put back meanwhile makes the write fail
  // instead of going elsewhere or hanging.
  unlink(temp.c_str());
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC,
                mode);
  if (fd < 0) return Errno("cannot create", temp);
  if (struct stat status; fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", temp, ": not a regular file"));
  }
  auto fail = [&](absl::string_view what) {
    absl::Status status = Errno(what, temp);
    close(fd);
    unlink(temp.c_str());
    return status;
  };
  size_t written = 0;
  while (written < contents.size()) {
    ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write");
    if (n == 0) {
      errno = ENOSPC;
      return fail("cannot write");
    }
    written += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail("cannot fsync");
  if (close(fd) != 0) {
    absl::Status status = Errno("cannot close", temp);
    unlink(temp.c_str());
    return status;
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = Errno("cannot rename into", path);
    unlink(temp.c_str());
    return status;
  }
  // Make the rename itself durable.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> OpenForAppend(const std::string& path) {
  const int fd = open(path.c_str(),
                      O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot open", path);
  if (struct stat status; fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": not a regular file"));
  }
  return fd;
}

}  // namespace pst
