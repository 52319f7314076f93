#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "common/status_macros.h"

namespace pst {

namespace {

constexpr absl::string_view kNamePrefix = "/pstrain-";

std::string Errno() { return std::strerror(errno); }

// The mapped region the calling thread is copying to or from: how the
// SIGBUS handler tells a page its owner cut off from any other fault.
struct MappedAccess {
  char* base;
  int64_t size;
  std::atomic<bool>* cut_off;
};
constinit thread_local const MappedAccess* current_access = nullptr;

struct sigaction previous_sigbus;

// A copy touched a page past the end of a region its owner shrank (or
// whose memory ran out): private zero pages take the whole mapping's
// place, the copy goes on over them, and the region is marked cut off so
// that the copy is refused. Any other SIGBUS goes where it went before: a
// fault elsewhere takes the previous action (by default the process dies
// of it, as it would have without this handler), and one another process
// sent (kill -BUS: no fault, nothing to run again) goes to a previous
// handler if there is one and is otherwise ignored, this handler staying
// in place for the next real cut-off.
void OnSigbus(int signal, siginfo_t* info, void* context) {
  const MappedAccess* access = current_access;
  const char* address = static_cast<const char*>(info->si_addr);
  const bool sent = info->si_code <= 0;  // SI_USER, SI_QUEUE, SI_TKILL: not a fault
  if (!sent && access != nullptr && address >= access->base &&
      address < access->base + access->size &&
      mmap(access->base, static_cast<size_t>(access->size), PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
    access->cut_off->store(true, std::memory_order_relaxed);
    return;
  }
  if ((previous_sigbus.sa_flags & SA_SIGINFO) != 0 && previous_sigbus.sa_sigaction != nullptr) {
    previous_sigbus.sa_sigaction(signal, info, context);
  } else if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(signal);
  } else if (sent) {
    constexpr char kIgnored[] = "ignored a SIGBUS sent by another process (not a memory fault)\n";
    [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, kIgnored, sizeof(kIgnored) - 1);
  } else {
    // The faulting instruction runs again and takes the previous action.
    sigaction(SIGBUS, &previous_sigbus, nullptr);
  }
}

void InstallSigbusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_sigbus);
  });
}

absl::Status CutOffError(int64_t size) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the shared region of ", size, " bytes shrank under a copy (its owner cut it short)"));
}

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

namespace {

// Bytes past a region's end that hold its proof: one page, so that the
// region's own bytes stay whole pages.
int64_t ProofPageBytes() { return sysconf(_SC_PAGESIZE); }

std::string RandomProof() {
  std::random_device random;
  std::string proof(kRegionProofBytes, '\0');
  for (size_t i = 0; i < proof.size(); i += sizeof(uint32_t)) {
    const uint32_t word = random();
    std::memcpy(proof.data() + i, &word, std::min(sizeof(word), proof.size() - i));
  }
  return proof;
}

// A new object for a region of `size` bytes, every page allocated: a
// named one under a fresh name (which `name` gets), with a fresh `proof`
// written past the region's bytes.
absl::StatusOr<int> CreateNamedObject(int64_t size, std::string* name, std::string* proof) {
  static std::atomic<int> created{0};
  std::random_device random;
  // Unguessable, so that no other client can name it to the shard first.
  *name = absl::StrCat(SharedRegionPrefix(getpid()), created.fetch_add(1), "-",
                       absl::Hex(random(), absl::kZeroPad8), absl::Hex(random(), absl::kZeroPad8));
  const int fd = shm_open(name->c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create shared memory ", *name, ": ", Errno()));
  }
  // Every page is allocated now: a region on a full /dev/shm (a container's
  // is 64 MiB by default) is refused here, where the worker can keep to
  // TCP, instead of a later write into the mapping dying of SIGBUS.
  if (const int error = posix_fallocate(fd, 0, size + ProofPageBytes()); error != 0) {
    close(fd);
    shm_unlink(name->c_str());
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                     " bytes of shared memory for ", *name, ": ",
                                                     std::strerror(error)));
  }
  *proof = RandomProof();
  if (pwrite(fd, proof->data(), proof->size(), size) != static_cast<ssize_t>(proof->size())) {
    const std::string error = Errno();
    close(fd);
    shm_unlink(name->c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot write the proof of shared memory ", *name, ": ", error));
  }
  return fd;
}

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

// A sealed memfd of `size` bytes, every page allocated; Unimplemented where
// the kernel has no memfd sealing (the caller then names one instead).
absl::StatusOr<int> CreateSealedObject(int64_t size) {
  const int fd = memfd_create("pstrain-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::UnimplementedError(absl::StrCat("cannot create a memfd: ", Errno()));
  }
  if (ftruncate(fd, size) != 0) {
    const std::string error = Errno();
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size a memfd to ", size, " bytes: ", error));
  }
  // As for a named object: a region the memory cannot hold is refused now.
  if (const int error = posix_fallocate(fd, 0, size); error != 0) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size,
                                                     " bytes of shared memory: ",
                                                     std::strerror(error)));
  }
  // Sealed before any other process can see it: no one, this process
  // included, can change its size again, nor unseal it.
  if (fcntl(fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    const std::string error = Errno();
    close(fd);
    return absl::UnimplementedError(absl::StrCat("cannot seal a memfd: ", error));
  }
  return fd;
}

// A new object of `*kind` for a region of `size` bytes; `*kind` becomes
// kNamed where a sealed one cannot be made.
absl::StatusOr<int> CreateObject(int64_t size, SharedRegion::Kind* kind, std::string* name,
                                 std::string* proof) {
  name->clear();
  proof->clear();
  if (*kind == SharedRegion::Kind::kSealed) {
    absl::StatusOr<int> fd = CreateSealedObject(size);
    if (fd.ok() || fd.status().code() != absl::StatusCode::kUnimplemented) return fd;
    *kind = SharedRegion::Kind::kNamed;
  }
  return CreateNamedObject(size, name, proof);
}

// Closes `fd` and removes `name`, if any: an object that never got used.
void Discard(int fd, const std::string& name) {
  close(fd);
  if (!name.empty()) shm_unlink(name.c_str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(int64_t bytes, Kind kind) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  if (bytes <= 0) return absl::InvalidArgumentError("a shared region needs at least one byte");
  const int64_t size = (bytes + page - 1) / page * page;
  std::string name;
  std::string proof;
  absl::StatusOr<int> fd = CreateObject(size, &kind, &name, &proof);
  if (!fd.ok()) return fd.status();
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (data == MAP_FAILED) {
    const std::string error = Errno();
    Discard(*fd, name);
    return absl::ResourceExhaustedError(absl::StrCat("cannot map shared memory: ", error));
  }
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(kind, name, std::move(proof), *fd, static_cast<char*>(data), size));
}

absl::Status SharedRegion::Renew(Kind kind) {
  std::string name;
  std::string proof;
  absl::StatusOr<int> fd = CreateObject(size_, &kind, &name, &proof);
  if (!fd.ok()) return fd.status();
  // The contents first, then the new object mapped over the old one in a
  // single step: the address range never holds anything else.
  for (int64_t written = 0; written < size_;) {
    const ssize_t n = pwrite(*fd, data_ + written, size_ - written, written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string error = n < 0 ? Errno() : "nothing written";
      Discard(*fd, name);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot copy a shared region into a new object: ", error));
    }
    written += n;
  }
  if (mmap(data_, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, *fd, 0) == MAP_FAILED) {
    const std::string error = Errno();
    Discard(*fd, name);
    return absl::ResourceExhaustedError(absl::StrCat("cannot map shared memory: ", error));
  }
  if (fd_ >= 0) close(fd_);
  MarkOffered();  // the old name, if any, goes
  kind_ = kind;
  name_ = std::move(name);
  proof_ = std::move(proof);
  fd_ = *fd;
  fresh_ = true;
  return absl::OkStatus();
}

absl::Status SharedRegion::Detach() {
  std::vector<char> contents(data_, data_ + size_);
  if (mmap(data_, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
      MAP_FAILED) {
    // The range still maps the shared object, unchanged.
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map private memory over a shared region: ", Errno()));
  }
  std::memcpy(data_, contents.data(), contents.size());
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  MarkOffered();
  return absl::OkStatus();
}

SharedRegion::~SharedRegion() {
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  MarkOffered();
}

void SharedRegion::MarkOffered() {
  if (!fresh_) return;
  fresh_ = false;
  if (!name_.empty()) shm_unlink(name_.c_str());  // ENOENT: the shard has unlinked it already
}

absl::StatusOr<std::unique_ptr<OpenedRegion>> OpenedRegion::Open(absl::string_view name,
                                                                 int64_t bytes,
                                                                 absl::string_view proof) {
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
  struct stat status;
  if (bytes <= 0 || fstat(fd, &status) != 0 || !S_ISREG(status.st_mode) ||
      status.st_size != bytes + ProofPageBytes()) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory ", path, " is not a region of the ", bytes, " bytes announced"));
  }
  // The name was visible in /dev/shm from its creation: whoever offers it
  // must also hold the proof its creator wrote there, which only processes
  // that may read the object (its creator's user) can know. A wrong offer
  // leaves the name in place for the worker's own.
  std::string written(kRegionProofBytes, '\0');
  if (proof.size() != kRegionProofBytes ||
      pread(fd, written.data(), written.size(), bytes) != static_cast<ssize_t>(written.size()) ||
      !ConstantTimeEquals(written, proof)) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        "shared memory ", path, " does not hold the proof its attach carried: a worker offers "
        "only the regions it created"));
  }
  // The name has done its work: from here only the two open ends hold the
  // memory, and it goes when both have closed it, however they end.
  shm_unlink(path.c_str());
  // No MAP_POPULATE: a page is committed when an exchange first touches
  // it, so attaching costs no memory and no time, and a region the worker
  // never wrote (or sized far past its tensors) commits only the ranges
  // exchanges use, which are bounded by the shard's share.
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const std::string error = Errno();
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map shared memory ", path, " of ", bytes, " bytes here: ", error));
  }
  InstallSigbusHandler();
  return std::unique_ptr<OpenedRegion>(
      new OpenedRegion(fd, static_cast<char*>(data), bytes, /*sealed=*/false));
}

absl::StatusOr<std::unique_ptr<OpenedRegion>> OpenedRegion::Adopt(int fd, int64_t bytes) {
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{fd};
  struct stat status;
  if (bytes <= 0 || fstat(fd, &status) != 0 || !S_ISREG(status.st_mode) ||
      status.st_size != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the descriptor handed over is not a region of the ", bytes,
                     " bytes announced"));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return absl::PermissionDeniedError(
        "the region handed over is not sealed against shrinking and growing (F_SEAL_SHRINK, "
        "F_SEAL_GROW): a worker hands over only sealed memfds");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::PermissionDeniedError(
        "the region handed over is sealed against writing: the shard writes its answers there");
  }
  // Not touched here either: pages are committed as exchanges reach them.
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot map a sealed region of ", bytes, " bytes here: ", Errno()));
  }
  const int owned = closer.fd;
  closer.fd = -1;
  return std::unique_ptr<OpenedRegion>(
      new OpenedRegion(owned, static_cast<char*>(data), bytes, /*sealed=*/true));
}

OpenedRegion::~OpenedRegion() {
  munmap(data_, static_cast<size_t>(size_));
  close(fd_);
}

absl::Status OpenedRegion::CheckRange(int64_t offset, int64_t bytes) const {
  if (offset < 0 || bytes < 0 || offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes [", offset, ", +", bytes, ") lie outside the shared region of ", size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status OpenedRegion::CheckNotShrunk() const {
  if (sealed_) return absl::OkStatus();
  if (cut_off_.load(std::memory_order_relaxed)) return CutOffError(size_);
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

absl::Status OpenedRegion::Guarded(absl::FunctionRef<void()> access) const {
  if (sealed_) {
    // Its size is sealed: no page of the mapping can be cut off.
    access();
    return absl::OkStatus();
  }
  if (cut_off_.load(std::memory_order_relaxed)) return CutOffError(size_);
  const MappedAccess mapped{.base = data_, .size = size_, .cut_off = &cut_off_};
  const MappedAccess* const outer = current_access;
  current_access = &mapped;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  access();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  current_access = outer;
  if (cut_off_.load(std::memory_order_relaxed)) return CutOffError(size_);
  return absl::OkStatus();
}

absl::Status OpenedRegion::Read(int64_t offset, std::span<char> dest) const {
  PST_RETURN_IF_ERROR(CheckRange(offset, static_cast<int64_t>(dest.size())));
  return Guarded([&] { std::memcpy(dest.data(), data_ + offset, dest.size()); });
}

absl::Status OpenedRegion::Write(int64_t offset, std::span<const char> src) const {
  PST_RETURN_IF_ERROR(CheckRange(offset, static_cast<int64_t>(src.size())));
  return Guarded([&] { std::memcpy(data_ + offset, src.data(), src.size()); });
}

absl::Status OpenedRegion::Visit(int64_t offset, int64_t bytes,
                                 absl::FunctionRef<void(std::span<const char>)> visit) const {
  PST_RETURN_IF_ERROR(CheckRange(offset, bytes));
  return Guarded([&] { visit({data_ + offset, static_cast<size_t>(bytes)}); });
}

}  // namespace pst
