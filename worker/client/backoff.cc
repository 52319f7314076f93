#include "worker/client/backoff.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pst {

Retry::Retry(absl::Duration budget, uint64_t seed)
    : deadline(absl::Now() + budget), budget(budget), jitter(seed) {}

Retry NewRetry(absl::Duration budget, int rank) {
  return Retry(budget, static_cast<uint64_t>(rank) * 7919 + absl::ToUnixNanos(absl::Now()));
}

absl::Status BackOff(const absl::Status& last, Retry* retry) {
  if (absl::Now() > retry->deadline) {
    // Not 2: a launcher restarts this worker, and a later try may pass.
    return absl::UnavailableError(absl::StrCat(
        "gave up waiting for the parameter servers after training.pull_timeout_seconds (",
        absl::ToInt64Seconds(retry->budget), " s): ", last.message()));
  }
  absl::SleepFor(retry->backoff *
                 (0.5 + 0.5 * static_cast<double>(retry->jitter() >> 11) * 0x1.0p-53));
  retry->backoff = std::min(retry->backoff * 2, retry->max_backoff);
  return absl::OkStatus();
}

}  // namespace pst
