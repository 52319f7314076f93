// The shard's AwaitWorkersDone long-polls, held without a thread (a waiter
// in the shard), and who may hold them. The wait is about the job's own
// progress, so no caller can take another task's place in it:
// - a worker holds at most kPerWorker waits at once (its wait, and one
//   whose call is still ending); a further one answers that worker's oldest
//   at once (OK, with the shard's state then), so the newest call of a
//   worker always waits. Whoever may act as the worker (its task token, or
//   anyone without auth) can only hurry that worker's own answers.
// - an observer (a call that names no worker: psctl, a dashboard) waits in
//   a pool shared by observers only, refused RESOURCE_EXHAUSTED when full.
// A wait is answered when the shard's Stats would change its outcome (see
// ParameterShard::AwaitWorkersDoneOrWait), at its deadline, or as its
// caller goes away.
#ifndef PST_PS_SERVER_SERVICE_DONE_WAITS_H_
#define PST_PS_SERVER_SERVICE_DONE_WAITS_H_

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "ps.pb.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/unary_call.h"

namespace pst {

class DoneWaits {
 public:
  using Call = UnaryCall<AwaitWorkersDoneRequest, StatsResponse>;
  static constexpr int kPerWorker = 2;

  // `shard` and `threads` (where woken waits are answered) must outlive
  // every call served. `observer_cap`: waits of observers at once.
  DoneWaits(ParameterShard* shard, ThreadPool* threads, int observer_cap);
  DoneWaits(const DoneWaits&) = delete;
  DoneWaits& operator=(const DoneWaits&) = delete;

  // Serves `call` for `worker` (already checked to be a worker of the job
  // the caller may act as), or for an observer (nullopt), waiting until
  // `deadline` at most.
  void Serve(Call* call, std::optional<int> worker, absl::Time deadline);

  // Waits held now: by `worker`'s calls, and by observers'.
  int waiting_of(int worker) const;
  int observers_waiting() const;

 private:
  class Wait;
  // Forgets a wait that has answered its call.
  void Release(const Wait* wait);

  ParameterShard* const shard_;
  ThreadPool* const threads_;
  const int observer_cap_;
  mutable absl::Mutex mu_;
  // Each worker's waits, oldest first.
  std::vector<std::deque<std::shared_ptr<Wait>>> by_worker_ ABSL_GUARDED_BY(mu_);
  int observers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_DONE_WAITS_H_
