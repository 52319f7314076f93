#include "ps_server/core/shard_calls.h"

#include <optional>

#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "ps_server/core/pull_reply.h"

namespace pst {
namespace {

// Calls `attempt` with a wake callback until it answers 0 (done), waiting
// for the wake between attempts.
template <typename Attempt>
absl::Status UntilDone(Attempt attempt) {
  while (true) {
    absl::Notification woken;
    PST_ASSIGN_OR_RETURN(const ParameterShard::WaitId waiting,
                         attempt([&woken] { woken.Notify(); }));
    if (waiting == 0) return absl::OkStatus();
    woken.WaitForNotification();
  }
}

}  // namespace

absl::Status PullVisit(ParameterShard& shard, const PullRequest& request, absl::Time deadline,
                       const ParameterShard::PullVisitor& visit) {
  return UntilDone([&](absl::AnyInvocable<void()> wake) {
    return shard.PullVisitOrWait(request, deadline, visit, std::move(wake));
  });
}

absl::Status Pull(ParameterShard& shard, const PullRequest& request, absl::Time deadline,
                  PullResponse* response, const PullBounds& bounds) {
  absl::Status answer;
  PST_RETURN_IF_ERROR(PullVisit(
      shard, request, deadline,
      [&](int64_t version, const std::vector<const Variable*>& variables,
          const PulledRows& rows) {
        answer = CheckPullReply(variables, rows, request.dtype(), bounds.max_reply_bytes);
        if (!answer.ok()) return;
        response->set_version(version);
        for (const Variable* v : variables) {
          EncodeTensor(v->name, v->shape, *v->values, response->add_variables(), request.dtype());
        }
        answer = rows.AnswerTo(response);
      }));
  return answer;
}

absl::Status Push(ParameterShard& shard, const PushRequest& request, PushResponse* response,
                  PushChecked checked) {
  while (true) {
    if (std::optional<absl::Status> pushed = shard.TryPush(request, response, checked)) {
      return *pushed;
    }
    absl::Notification woken;
    if (shard.AwaitUpdateTurnOrWait([&woken] { woken.Notify(); }) != 0) {
      woken.WaitForNotification();
    }
  }
}

absl::Status AwaitWorkersDone(ParameterShard& shard, const AwaitWorkersDoneRequest& request,
                              absl::Time deadline, StatsResponse* response) {
  return UntilDone([&](absl::AnyInvocable<void()> wake) {
    return shard.AwaitWorkersDoneOrWait(request, deadline, response, std::move(wake));
  });
}

}  // namespace pst
