#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pst {

namespace {

constexpr absl::string_view kNamePrefix = "/pstrain-";

std::string Errno() { return std::strerror(errno); }

}  // namespace

absl::StatusOr<std::string> HostBootId() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(file, id) || id.empty()) {
    return absl::UnavailableError("cannot read /proc/sys/kernel/random/boot_id");
  }
  return std::string(absl::StripAsciiWhitespace(id));
}

bool IsSharedRegionName(absl::string_view name) {
  if (!absl::StartsWith(name, kNamePrefix)) return false;
  const absl::string_view rest = name.substr(kNamePrefix.size());
  if (rest.empty() || rest.size() > 64) return false;
  for (char c : rest) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return true;
}

std::string SharedRegionPrefix(int64_t pid) { return absl::StrCat(kNamePrefix, pid, "-"); }

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(int64_t bytes) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  if (bytes <= 0) return absl::InvalidArgumentError("a shared region needs at least one byte");
  const int64_t size = (bytes + page - 1) / page * page;
  static std::atomic<int> created{0};
  std::random_device random;
  // Unguessable, so that no other client can name it to the shard first.
  const std::string name =
      absl::StrCat(SharedRegionPrefix(getpid()), created.fetch_add(1), "-",
                   absl::Hex(random(), absl::kZeroPad8), absl::Hex(random(), absl::kZeroPad8));
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create shared memory ", name, ": ", Errno()));
  }
  // Every page is allocated now: a region on a full /dev/shm (a container's
  // is 64 MiB by default) is refused here, where the worker can keep to
  // TCP, instead of a later write into the mapping dying of SIGBUS.
  if (const int error = posix_fallocate(fd, 0, size); error != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                     " bytes of shared memory for ", name, ": ",
                                                     std::strerror(error)));
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const std::string error = Errno();
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map shared memory ", name, ": ", error));
  }
  return std::unique_ptr<SharedRegion>(new SharedRegion(name, fd, static_cast<char*>(data), size));
}

SharedRegion::~SharedRegion() {
  munmap(data_, size_);
  close(fd_);
  Unlink();
}

void SharedRegion::Unlink() {
  if (!linked_) return;
  linked_ = false;
  shm_unlink(name_.c_str());  // ENOENT: the shard has unlinked it already
}

absl::StatusOr<std::unique_ptr<OpenedRegion>> OpenedRegion::Open(absl::string_view name,
                                                                 int64_t bytes) {
  if (!IsSharedRegionName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CHexEscape(name.substr(0, 80)),
                     "\" is not a shared region's name (\"/pstrain-\" and up to 64 letters, "
                     "digits or '-')"));
  }
  const std::string path(name);
  const int fd = shm_open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open shared memory ", path, " (", Errno(),
                     "): the worker is on another host or in another IPC namespace"));
  }
  // The name has done its work: from here only the two open ends hold the
  // memory, and it goes when both have closed it, however they end.
  shm_unlink(path.c_str());
  struct stat status;
  if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode) || status.st_size != bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory ", path, " is not a region of the ", bytes, " bytes announced"));
  }
  // Writes past a file-size limit (RLIMIT_FSIZE, e.g. a PS run under
  // prlimit) fail even inside a region's size: find out now, while the
  // worker can still choose TCP, not at the first answer.
  char last = 0;
  if (pread(fd, &last, 1, bytes - 1) != 1 || pwrite(fd, &last, 1, bytes - 1) != 1) {
    const std::string error = Errno();
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("cannot write shared memory ", path, " of ",
                                                      bytes, " bytes here (", error,
                                                      "; a file-size limit?)"));
  }
  return std::unique_ptr<OpenedRegion>(new OpenedRegion(fd, bytes));
}

OpenedRegion::~OpenedRegion() { close(fd_); }

absl::Status OpenedRegion::CheckRange(int64_t offset, int64_t bytes) const {
  if (offset < 0 || bytes < 0 || offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes [", offset, ", +", bytes, ") lie outside the shared region of ", size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status OpenedRegion::CheckNotShrunk() const {
  struct stat status;
  if (fstat(fd_, &status) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat a shared region: ", Errno()));
  }
  if (status.st_size < size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shared region shrank from ", size_, " to ", status.st_size, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status OpenedRegion::Read(int64_t offset, std::span<char> dest) const {
  if (absl::Status s = CheckRange(offset, static_cast<int64_t>(dest.size())); !s.ok()) return s;
  size_t done = 0;
  while (done < dest.size()) {
    const ssize_t got =
        pread(fd_, dest.data() + done, dest.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the shared region ended ", offset + done, " bytes in, before the ",
                       dest.size(), " bytes announced at ", offset, " (it shrank)"));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status OpenedRegion::Write(int64_t offset, std::span<const char> src) const {
  if (absl::Status s = CheckRange(offset, static_cast<int64_t>(src.size())); !s.ok()) return s;
  size_t done = 0;
  while (done < src.size()) {
    const ssize_t put =
        pwrite(fd_, src.data() + done, src.size() - done, static_cast<off_t>(offset + done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      return absl::InternalError(absl::StrCat("cannot write the shared region: ", Errno()));
    }
    done += static_cast<size_t>(put);
  }
  return absl::OkStatus();
}

}  // namespace pst
