// Which session (rpc/worker_session.h) speaks for each worker of a shard.
// The first session to call for a worker holds it; another is refused
// while the holder's lease is live (the shard's live set: heard from
// within the lease, or a call in flight), and takes the worker over once
// the lease has run out: a restarted worker process waits out its former
// self's lease, and a local process that names a live worker's id gets
// nothing of it (no exchange slot, no region, no heartbeat on its behalf).
// Calls with no session (0) are a session of their own.
#ifndef PST_PS_SERVER_SERVICE_WORKER_SESSIONS_H_
#define PST_PS_SERVER_SERVICE_WORKER_SESSIONS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pst {

class WorkerSessions {
 public:
  // `live(worker)` says whether a worker's lease is live now.
  WorkerSessions(int num_workers, std::function<bool(int worker)> live);

  // Admits a call of `session` acting as `worker`: OK if the worker has no
  // holder, `session` holds it, or the holder's lease has run out (then
  // `session` holds it from now). Unavailable, saying so, for any other
  // session: the caller may try again once the lease has run out. A worker
  // outside the job is left to the shard to refuse.
  absl::Status Admit(int worker, uint64_t session);

  // Calls refused so far.
  int64_t refused() const;

 private:
  const std::function<bool(int)> live_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> holders_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> held_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_WORKER_SESSIONS_H_
