// The checks a shard (parameter_shard.h) makes of a request's own fields
// before it touches anything, each refusal one line that names the field.
#ifndef PST_PS_SERVER_CORE_SHARD_REQUESTS_H_
#define PST_PS_SERVER_CORE_SHARD_REQUESTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "ps.pb.h"

namespace pst {

// InvalidArgument unless 0 <= worker < num_workers.
absl::Status CheckWorkerIndex(int worker, int num_workers);
// A pull's worker, and its wire dtype.
absl::Status CheckPullFields(const PullRequest& pull, int num_workers);
// FailedPrecondition: a push reached a shard whose variables are not set.
absl::Status PushBeforeInit();
// A push (or a streamed push's header) at a shard at `version`: the version
// it claims to be computed at is 0..version, and it carries gradients or
// rows (an empty one would still move the version).
absl::Status CheckPushClaims(const PushRequest& push, int shard, int64_t version);
// Unavailable, marked kRestarting: a push claiming `claimed`, a version
// past this shard's, from a worker that has not registered with this
// process. The shard went back to its checkpoint (restarted while the
// worker computed): the worker registers again and runs its step anew.
absl::Status PushAheadOfARestartedShard(int shard, int64_t claimed, int64_t version);
// Whether a push carries anything to apply: a gradient, or a row id. One
// that names tables with no ids is a worker's part of a SYNC step, and
// changes nothing in ASYNC and SSP (PushResponse::UNCHANGED).
bool PushCarriesAnUpdate(const PushRequest& push);
// DeadlineExceeded for a pull that could not proceed in time, at a shard
// at `version`: naming what it waited for (Init, its min_version, or, at
// `staleness`, the slowest live worker).
absl::Status PullTimedOut(const PullRequest& pull, int shard, bool initialized, int64_t version,
                          int staleness);
// AwaitWorkersDone's timeout and known_changes.
absl::Status CheckAwaitWorkersDone(const AwaitWorkersDoneRequest& request);

// Whether every value of the push's dense gradients, or of its embedding
// rows, is finite (an unknown dtype counts as not: the tables name it).
bool GradientsFinite(const PushRequest& push);
bool RowsFinite(const PushRequest& push);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SHARD_REQUESTS_H_
