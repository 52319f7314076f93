// The shard's calls for a caller that may hold a thread while it waits
// (tests, fuzzers, benchmarks, tools): each runs the shard's one entry
// point (PullVisitOrWait, TryPush with AwaitUpdateTurnOrWait,
// AwaitWorkersDoneOrWait) and, where that leaves a waiter, blocks on a
// notification until the waiter is woken, then calls again.
#ifndef PST_PS_SERVER_CORE_SHARD_CALLS_H_
#define PST_PS_SERVER_CORE_SHARD_CALLS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ps.pb.h"
#include "ps_server/core/parameter_shard.h"

namespace pst {

// What a caller adds to a pull's deadline.
struct PullBounds {
  // ResourceExhausted, before anything is encoded, if the answer would be
  // larger (pull_reply.h: PullReplyBytes). 0: no bound.
  int64_t max_reply_bytes = 0;
};

// Waits (up to `deadline`) as ParameterShard::PullVisitOrWait says, then
// hands the variables and rows to `visit`.
absl::Status PullVisit(ParameterShard& shard, const PullRequest& request, absl::Time deadline,
                       const ParameterShard::PullVisitor& visit);
// As PullVisit, the variables and rows copied into `response` in
// request.dtype().
absl::Status Pull(ParameterShard& shard, const PullRequest& request, absl::Time deadline,
                  PullResponse* response, const PullBounds& bounds = {});
// The push, after waiting for its turn as often as it must.
absl::Status Push(ParameterShard& shard, const PushRequest& request, PushResponse* response,
                  PushChecked checked = {});
absl::Status AwaitWorkersDone(ParameterShard& shard, const AwaitWorkersDoneRequest& request,
                              absl::Time deadline, StatsResponse* response);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SHARD_CALLS_H_
