#include "worker/session/shard_patience.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace pst {

absl::StatusOr<RegisterResponse> RegisterPatiently(PsClient* client, absl::Status last,
                                                   Retry* retry) {
  while (true) {
    PST_RETURN_IF_ERROR(BackOff(last, retry));
    absl::StatusOr<RegisterResponse> view = client->Register();
    if (view.ok()) return view;
    if (!IsTransientShardError(view.status())) {
      return absl::Status(view.status().code(),
                          absl::StrCat("gave up reconnecting: ", view.status().message()));
    }
    last = view.status();
  }
}

absl::StatusOr<WorkersAtEnd> AwaitAllWorkersDone(PsClient* client, int workers,
                                                 absl::Duration patience) {
  // One long-poll's longest wait: each call is bounded, and a quiet shard
  // costs one call per this.
  constexpr absl::Duration kLongPoll = absl::Seconds(10);
  absl::Time deadline = absl::Now() + patience;
  int64_t known_changes = -1;  // nothing seen yet: answered at once
  absl::Duration wait = absl::ZeroDuration();
  while (true) {
    // Answered when the workers' standing changes, so every change that can
    // decide the outcome below is seen as it happens.
    // A shard busy or restarting is waited out by the client
    // (PsClient::set_call_patience).
    PST_ASSIGN_OR_RETURN(StatsResponse stats, client->AwaitWorkersDone(0, known_changes, wait));
    known_changes = stats.worker_changes();
    WorkersAtEnd at_end{std::move(stats), {}};
    if (at_end.stats.workers_done() >= workers) return at_end;
    for (const WorkerStats& w : at_end.stats.workers()) {
      // A worker never heard from counts as live to the shard (it may be
      // starting), but by now it should have trained: it is missing too.
      if (!w.done() && (!w.live() || w.seconds_since_seen() < 0)) {
        at_end.missing.push_back(w.worker());
      }
    }
    const absl::Time now = absl::Now();
    // While every unfinished worker is still training, waiting is progress.
    if (at_end.missing.empty()) deadline = now + patience;
    if (now > deadline) return at_end;
    wait = at_end.missing.empty() ? kLongPoll : std::min(kLongPoll, deadline - now);
  }
}

void HeartbeatUntil(PsClient* client, absl::Duration lease, absl::Notification* stop) {
  const absl::Duration period = lease / 4;
  while (!stop->WaitForNotificationWithTimeout(period)) {
    client->Heartbeat().IgnoreError();
  }
}

}  // namespace pst
