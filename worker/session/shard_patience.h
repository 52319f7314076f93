// How a worker waits on the shards when they are not ready for it: a
// registration retried with backoff across a shard's restart, heartbeats
// while it computes, and the chief's wait for every worker to finish: the
// pieces TrainingSession (training_session.h) is made of.
#ifndef PST_WORKER_SESSION_SHARD_PATIENCE_H_
#define PST_WORKER_SESSION_SHARD_PATIENCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ps.pb.h"
#include "worker/client/backoff.h"
#include "worker/client/ps_client.h"

namespace pst {

// Registers with every shard after `last` (a transient refusal), with
// `retry`'s backoff and full jitter, until every shard answers.
// Unavailable once `retry`'s deadline has passed (a launcher restarts the
// worker); a refusal that is not transient ends it with its own code.
absl::StatusOr<RegisterResponse> RegisterPatiently(PsClient* client, absl::Status last,
                                                   Retry* retry);

// Keeps this worker in every shard's live set while it computes: a
// heartbeat every `lease` / 4 until `stop` is notified. A failed heartbeat
// is not fatal: the next exchange reports the shard's state with its error.
void HeartbeatUntil(PsClient* client, absl::Duration lease, absl::Notification* stop);

// How the workers stood when the chief stopped waiting for them: shard 0's
// Stats, and the workers it gave up on.
struct WorkersAtEnd {
  StatsResponse stats;
  std::vector<int> missing;
};
// Waits until all `workers` are done, long-polling shard 0; gives up on
// workers neither done nor in the live set (or never heard from) for
// `patience`.
absl::StatusOr<WorkersAtEnd> AwaitAllWorkersDone(PsClient* client, int workers,
                                                 absl::Duration patience);

}  // namespace pst

#endif  // PST_WORKER_SESSION_SHARD_PATIENCE_H_
