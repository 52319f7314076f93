// The shared-memory regions workers on this host have attached to the
// shard (common/shared_memory.h): at most one per worker, found by the
// handle Attach (a named region) or the region inbox (a sealed one)
// returned. A worker that attaches again replaces its region,
// so a shard holds at most one descriptor per worker, however often a
// worker reconnects. A region's pages are the worker's (the shard maps
// them, and copies a push's and an answer's bytes), so its size costs the
// shard address space and page tables only; it is still bounded, by the
// largest push and answer the shard takes.
#ifndef PST_PS_SERVER_SHM_SHM_REGIONS_H_
#define PST_PS_SERVER_SHM_SHM_REGIONS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shared_memory.h"
#include "ps_server/shm/region_inbox.h"
#include "ps.pb.h"

namespace pst {

class ShmRegions {
 public:
  // `enabled` false (cluster.shm SHM_OFF) refuses every attach.
  ShmRegions(bool enabled, int num_workers, int64_t max_region_bytes);

  // Opens the named region the request names; or, for a sealed one,
  // answers with the inbox's socket and a fresh nonce, and the region is
  // attached when its descriptor comes to the inbox with that nonce
  // (within kHandoffDeadline; one pending handoff per worker, a newer
  // attach replacing it); without an inbox, the answer names no socket and
  // the worker offers a named region. FailedPrecondition when it cannot be
  // shared here (disabled, another host or IPC namespace): the worker then
  // stays on TCP.
  // InvalidArgument for a bad worker, name or size.
  absl::Status Attach(const ShmAttachRequest& request, ShmAttachResponse* response);

  // How long a sealed attach's nonce waits for its descriptor.
  static constexpr absl::Duration kHandoffDeadline = absl::Seconds(10);

  // The inbox's socket name; empty if it could not be started.
  std::string inbox_name() const;

  // A region claimed for one exchange: the claim lasts until the pointer
  // is dropped.
  using Claimed = std::shared_ptr<const OpenedRegion>;
  // Told once a parked claim is decided: the region, handed straight from
  // the exchange that held it, or NotFound if the worker attached another
  // meanwhile. Runs on the thread that gave the region up, so it must not
  // block (an exchange posts its work to a pool); dropping the region it
  // gets hands it to the next waiter.
  using OnClaimed = absl::AnyInvocable<void(absl::StatusOr<Claimed>) &&>;
  // Names a parked claim, for CancelClaim; 0 names none.
  using ClaimId = uint64_t;

  // The region `handle` names, claimed for one exchange. A worker makes one
  // exchange at a time, so a region that is held is held by a call the
  // worker gave up on that the shard is still ending (or a long-polling
  // pull): the claim is then parked, holding no thread, and `on_claimed`
  // gets the region when that call drops it; the ClaimId returned names
  // the parked claim (and the region pointer is null). Parked claims are
  // bounded by the exchanges a shard admits (OpenStreams). NotFound if
  // there is no such region (the shard restarted, or the worker attached a
  // newer one): the worker attaches again. PermissionDenied if it is not
  // `worker`'s.
  struct Claim {
    Claimed region;    // claimed now, or
    ClaimId parked = 0;  // parked until on_claimed runs
  };
  absl::StatusOr<Claim> TryClaim(uint64_t handle, int worker, OnClaimed on_claimed);

  // Drops a parked claim, for a call that ended while it waited: true if it
  // was still parked (its on_claimed is destroyed without running), false
  // if on_claimed has run or is running.
  bool CancelClaim(ClaimId id);

  // Claims parked now.
  int waiting() const;

  // Regions attached now.
  int attached() const;

  // Handoffs the inbox refused so far (RegionInbox::refused); 0 without one.
  int64_t handoffs_refused() const;

 private:
  struct Parked {
    ClaimId id = 0;
    OnClaimed on_claimed;
  };
  // A sealed attach waiting for its descriptor.
  struct Handoff {
    std::string nonce;  // empty: none
    int64_t bytes = 0;
    absl::Time deadline;
  };
  struct Attached {
    Handoff handoff;
    uint64_t handle = 0;
    std::shared_ptr<const OpenedRegion> region;
    bool claimed = false;
    std::deque<Parked> parked;  // in arrival order
  };
  // Checks what every attach must satisfy: enabled, a worker of the job on
  // this host, a size this shard takes.
  absl::Status CheckAttach(const ShmAttachRequest& request) const;
  // The sealed region that came to the inbox with `nonce`, as the handle
  // of the worker whose attach gave that nonce out.
  absl::StatusOr<uint64_t> AdoptSealed(absl::string_view nonce, int fd);
  // Makes `region` worker's, replacing any other, and returns its handle.
  uint64_t Install(int worker, std::unique_ptr<OpenedRegion> region);
  // The region as a claim that gives itself back (to the next parked claim,
  // if any) when dropped.
  Claimed ClaimFor(int worker, uint64_t handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(int worker, uint64_t handle);
  const bool enabled_;
  const int num_workers_;
  const int64_t max_region_bytes_;
  const std::string boot_id_;  // empty if unreadable: nothing is shared
  mutable absl::Mutex mu_;
  std::vector<Attached> by_worker_ ABSL_GUARDED_BY(mu_);
  ClaimId next_claim_ ABSL_GUARDED_BY(mu_) = 1;
  // Last: its thread calls AdoptSealed until it is destroyed.
  std::unique_ptr<RegionInbox> inbox_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SHM_SHM_REGIONS_H_
