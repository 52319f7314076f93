#include "consistency/sync_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pst {

absl::StatusOr<Admission> SyncPolicy::AdmitPush(const ShardView& shard, int worker,
                                                int64_t computed_at) const {
  if (computed_at < shard.version) return Admission{.action = Admission::Action::kDrop};
  if (shard.workers[worker].pushed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker:", worker, " already pushed a gradient for version ", shard.version,
        "; SYNC takes one gradient per worker per step"));
  }
  return Admission{.action = Admission::Action::kAggregate};
}

int SyncPolicy::RequiredGradients(const ShardView& shard, int pushing) const {
  int active = 0;
  for (size_t i = 0; i < shard.workers.size(); ++i) {
    const WorkerProgress& w = shard.workers[i];
    const bool pushed = w.pushed || static_cast<int>(i) == pushing;
    active += (w.live && (!w.done || pushed)) ? 1 : 0;
  }
  const int wanted = replicas_ > 0 ? replicas_ : static_cast<int>(shard.workers.size());
  return std::max(1, std::min(wanted, active));
}

bool SyncPolicy::StepComplete(const ShardView& shard) const {
  const auto pushed = std::count_if(shard.workers.begin(), shard.workers.end(),
                                    [](const WorkerProgress& w) { return w.pushed; });
  return pushed > 0 && pushed >= RequiredGradients(shard);
}

bool SyncPolicy::CompletesStepAlone(const ShardView& shard, int worker) const {
  const bool none_pushed = std::none_of(shard.workers.begin(), shard.workers.end(),
                                        [](const WorkerProgress& w) { return w.pushed; });
  return none_pushed && RequiredGradients(shard, worker) == 1;
}

bool SyncPolicy::PullMayProceed(const ShardView& shard, int, int64_t min_version) const {
  return shard.version >= min_version;
}

}  // namespace pst
