// How a worker waits out a shard that refuses for now (restarting, busy):
// exponential backoff with full jitter, within one budget for the refusals
// in a row, so that restarting workers do not stampede a shard in
// lock-step and a shard that keeps refusing ends the run once it is spent.
#ifndef PST_WORKER_CLIENT_BACKOFF_H_
#define PST_WORKER_CLIENT_BACKOFF_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pst {

// The backoff and the deadline that a run of refusals in a row shares.
struct Retry {
  Retry(absl::Duration budget, uint64_t seed);
  absl::Time deadline;
  absl::Duration budget;
  absl::Duration backoff = absl::Milliseconds(100);
  // The backoff doubles up to this.
  absl::Duration max_backoff = absl::Seconds(5);
  std::mt19937_64 jitter;
};
// A budget of `budget` from now, jittered by `rank` and the clock.
Retry NewRetry(absl::Duration budget, int rank);

// Waits before the next try after `last` (a transient refusal);
// Unavailable, naming `last`, once `retry`'s deadline has passed (a
// launcher restarts the worker).
absl::Status BackOff(const absl::Status& last, Retry* retry);

}  // namespace pst

#endif  // PST_WORKER_CLIENT_BACKOFF_H_
