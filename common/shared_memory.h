// Same-host shared memory for tensors: a worker creates a region, maps it
// once and hands it to a PS shard on the same host; the two then move
// tensor bytes through it while gRPC carries only handles, shapes and
// offsets (ShmAttach, ExchangeChunk.shm in proto/ps.proto).
//
// A region is a sealed memfd where the kernel allows: it has no name, its
// size is sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) before anyone
// else sees it, and its descriptor reaches the shard over a Unix socket
// (common/region_handoff.h). Where that is not possible (no memfd sealing,
// or a shard in another network namespace that shares the IPC namespace,
// as compose's workers do) it is a POSIX shared memory object under an
// unguessable /dev/shm name with a proof written past its end; the shard
// opens it only with the proof and unlinks the name at once.
//
// The worker may keep its tensors in the region and compute on them there.
// The shard maps a region once and copies between it and its own buffers
// with memcpy, or reads a push where it lies (Visit) into results of its
// own; it never writes the model anywhere but its own memory. A worker can
// rewrite its region at any moment: what the shard reads is validated like
// bytes from a socket before anything is applied. A sealed region cannot
// shrink. A named one can: a copy that touches a page the worker has cut
// off is caught (a SIGBUS handler puts private zero pages in the mapping's
// place, as Wayland compositors do for client pools) and refused, never a
// crash. The handler is installed at the first OpenedRegion::Open of a
// named region and passes any other SIGBUS to the handler it replaced;
// code that installs a SIGBUS handler of its own after that must chain to
// it.
#ifndef PST_COMMON_SHARED_MEMORY_H_
#define PST_COMMON_SHARED_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pst {

// This host's boot id (/proc/sys/kernel/random/boot_id): two processes that
// see the same one run on the same kernel, so may share memory.
absl::StatusOr<std::string> HostBootId();

// Whether `name` is one a worker creates: "/pstrain-" and then 1 to 64
// letters, digits or '-'. A shard opens no other name, so a client cannot
// make it open another program's object (or a path: '/' is refused).
bool IsSharedRegionName(absl::string_view name);

// The prefix of every region's name that a process with this pid creates
// ("/pstrain-<pid>-"): tests look for leftovers with it.
std::string SharedRegionPrefix(int64_t pid);

// The bytes of a region's proof. The object behind a region of N bytes is
// one page longer; the proof, random bytes its creator writes at offset N,
// goes with the attach, and a shard opens the object only if the two match
// (the name alone is visible in /dev/shm to every local user).
inline constexpr size_t kRegionProofBytes = 32;

// A worker's region: created, sized and mapped here; unmapped and closed
// (and unlinked, if it is named and the shard has not done it) when
// destroyed.
class SharedRegion {
 public:
  enum class Kind {
    // A memfd sealed against shrinking and growing, with no name: its
    // descriptor goes to the shard (HandOverRegion).
    kSealed,
    // A /dev/shm object offered by name and proof.
    kNamed,
  };

  // A new region of `bytes` bytes (rounded up to whole pages), readable and
  // writable by this user only, every page allocated: of `kind`, except
  // that a sealed one is named where the kernel cannot seal a memfd.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(int64_t bytes,
                                                              Kind kind = Kind::kSealed);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  Kind kind() const { return kind_; }
  // The object's descriptor (what a sealed region hands over); -1 after
  // Detach.
  int fd() const { return fd_; }
  // A named region's name, and what proves this process created the
  // object under it: sent with the attach, never written anywhere else.
  // Both empty for a sealed region.
  const std::string& name() const { return name_; }
  const std::string& proof() const { return proof_; }
  std::span<char> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  // Marks the object as offered to a shard, so it is never offered again
  // (Renew makes a new one), and removes a named one's name (the memory
  // stays until both ends have closed it). Safe to call more than once,
  // and after the shard has unlinked the name.
  void MarkOffered();
  // Whether the object may still be offered: not yet offered, not
  // detached.
  bool fresh() const { return fresh_; }
  // Moves the region to a new object of `kind` (sealed where the kernel
  // allows), with the same contents and at the same address (spans into
  // bytes() stay valid), for a shard that has lost the old one (or, after
  // Detach, one to share again). The old object goes once the shard that
  // held it has closed it.
  absl::Status Renew(Kind kind);
  absl::Status Renew() { return Renew(kind_); }
  // Moves the contents, at the same address, to memory private to this
  // process, with no name anywhere (nothing left in /dev/shm if this
  // process is killed): for a shard that may still read the old object
  // after a failed exchange. Renew() shares them again.
  absl::Status Detach();

 private:
  SharedRegion(Kind kind, std::string name, std::string proof, int fd, char* data, int64_t size)
      : kind_(kind),
        name_(std::move(name)),
        proof_(std::move(proof)),
        fd_(fd),
        data_(data),
        size_(size) {}

  Kind kind_;
  std::string name_;
  std::string proof_;
  int fd_;
  char* data_;
  int64_t size_;
  bool fresh_ = true;
};

// A shard's view of a worker's region: mapped once, copied to and from.
class OpenedRegion {
 public:
  // Opens the region `name` of exactly `bytes` bytes whose creator wrote
  // `proof` (SharedRegion::proof), and then unlinks its name. Maps it
  // without touching it: no page is committed until a copy reaches it.
  // InvalidArgument for a name that is not a region's or a size that does
  // not match; PermissionDenied, leaving the name, if the proof does not
  // match; FailedPrecondition when it cannot be opened or mapped here
  // (another host or IPC namespace, an address-space limit).
  static absl::StatusOr<std::unique_ptr<OpenedRegion>> Open(absl::string_view name, int64_t bytes,
                                                          absl::string_view proof);
  // Takes `fd`, a sealed region of exactly `bytes` bytes its creator handed
  // over, and maps it without touching it; `fd` is closed whatever the
  // outcome. PermissionDenied unless it is sealed against shrinking and
  // growing (F_GET_SEALS) and not against writing; InvalidArgument for
  // another size or not a memory file; FailedPrecondition when it cannot be
  // mapped here.
  static absl::StatusOr<std::unique_ptr<OpenedRegion>> Adopt(int fd, int64_t bytes);
  ~OpenedRegion();
  OpenedRegion(const OpenedRegion&) = delete;
  OpenedRegion& operator=(const OpenedRegion&) = delete;

  int64_t size() const { return size_; }
  // Whether its size is sealed: it cannot shrink, and copies need no guard.
  bool sealed() const { return sealed_; }
  // InvalidArgument unless [offset, offset + bytes) lies within the size
  // announced at Open or Adopt.
  absl::Status CheckRange(int64_t offset, int64_t bytes) const;
  // InvalidArgument if the region is now smaller than announced (its owner
  // shrank it), or a copy has found it so.
  absl::Status CheckNotShrunk() const;
  // Copies region bytes [offset, offset + dest.size()) into `dest`;
  // InvalidArgument if the range is outside the region or could not be
  // read whole (the region shrank: from then on every copy is refused).
  absl::Status Read(int64_t offset, std::span<char> dest) const;
  // Copies `src` to region bytes [offset, offset + src.size()); the same
  // refusals as Read.
  absl::Status Write(int64_t offset, std::span<const char> src) const;
  // Runs `visit` on region bytes [offset, offset + bytes) where they lie,
  // for a caller that reads each byte once (what the owner writes
  // meanwhile may or may not be seen); the same refusals as Read.
  absl::Status Visit(int64_t offset, int64_t bytes,
                     absl::FunctionRef<void(std::span<const char>)> visit) const;

 private:
  OpenedRegion(int fd, char* data, int64_t size, bool sealed)
      : fd_(fd), data_(data), size_(size), sealed_(sealed) {}
  // Runs `access`, which touches the mapping, catching a fault on a page
  // the owner of a named region has cut off.
  absl::Status Guarded(absl::FunctionRef<void()> access) const;

  int fd_;
  char* data_;
  int64_t size_;
  bool sealed_;
  // A copy faulted: the mapping is private zero pages now.
  mutable std::atomic<bool> cut_off_{false};
};

}  // namespace pst

#endif  // PST_COMMON_SHARED_MEMORY_H_
