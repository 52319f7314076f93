#include "common/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status DurableFileWriter::Append(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", temp_);
    if (n == 0) {
      errno = ENOSPC;
      return Errno("cannot write", temp_);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status DurableFileWriter::WriteAt(uint64_t offset, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("cannot write", temp_);
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteFileDurably(const std::string& path, const std::string& contents,
                              mode_t mode) {
  return WriteFileDurably(
      path, [&](DurableFileWriter& file) { return file.Append(contents); }, mode);
}

absl::Status WriteFileDurably(const std::string& path,
                              absl::FunctionRef<absl::Status(DurableFileWriter&)> write,
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
  auto fail = [&](absl::Status status) {
    close(fd);
    unlink(temp.c_str());
    return status;
  };
  DurableFileWriter file(fd, temp);
  if (absl::Status written = write(file); !written.ok()) return fail(std::move(written));
  if (fsync(fd) != 0) return fail(Errno("cannot fsync", temp));
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
