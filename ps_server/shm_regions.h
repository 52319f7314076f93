// The shared-memory regions workers on this host have attached to the
// shard (common/shared_memory.h): at most one per worker, found by the
// handle Attach returned. A worker that attaches again replaces its region,
// so a shard holds at most one descriptor per worker, however often a
// worker reconnects. A region's pages are the worker's (the shard maps
// them, and copies a push's and an answer's bytes), so its size costs the
// shard address space and page tables only; it is still bounded, by the
// largest push and answer the shard takes.
#ifndef PST_PS_SERVER_SHM_REGIONS_H_
#define PST_PS_SERVER_SHM_REGIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shared_memory.h"
#include "ps.pb.h"

namespace pst {

class ShmRegions {
 public:
  // `enabled` false (cluster.shm SHM_OFF) refuses every attach.
  ShmRegions(bool enabled, int num_workers, int64_t max_region_bytes);

  // Opens the region the request names. FailedPrecondition when it cannot
  // be shared here (disabled, another host or IPC namespace): the worker
  // then stays on TCP. InvalidArgument for a bad worker, name or size.
  absl::Status Attach(const ShmAttachRequest& request, ShmAttachResponse* response);

  // The region `handle` names, claimed for one exchange until the returned
  // pointer is dropped; while another exchange holds it, this waits (until
  // `deadline`: DeadlineExceeded). A worker makes one exchange at a time,
  // so the wait is for a call it has given up on that the shard is still
  // ending; it bounds what exchanges make the shard buffer to one region's
  // worth per worker. NotFound if there is no such region (the shard
  // restarted, or the worker attached a newer one): the worker attaches
  // again. PermissionDenied if it is not `worker`'s.
  absl::StatusOr<std::shared_ptr<const OpenedRegion>> Claim(uint64_t handle, int worker,
                                                            absl::Time deadline);

  // Exchanges waiting in Claim now.
  int waiting() const;

  // Regions attached now.
  int attached() const;

 private:
  struct Attached {
    uint64_t handle = 0;
    std::shared_ptr<const OpenedRegion> region;
    bool claimed = false;
  };
  void Release(int worker, uint64_t handle);
  const bool enabled_;
  const int64_t max_region_bytes_;
  const std::string boot_id_;  // empty if unreadable: nothing is shared
  mutable absl::Mutex mu_;
  std::vector<Attached> by_worker_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SHM_REGIONS_H_
