#include "consistency/async_policy.h"

namespace pst {

absl::StatusOr<Admission> AsyncPolicy::AdmitPush(const ShardView& shard, int,
                                                 int64_t computed_at) const {
  const int64_t staleness = shard.version - computed_at;
  if (max_staleness_ > 0 && staleness > max_staleness_) {
    return Admission{.action = Admission::Action::kDrop};
  }
  return Admission{.action = Admission::Action::kApply,
                   .lr_scale = lr_scaling_ ? 1.0f / (1.0f + static_cast<float>(staleness)) : 1.0f};
}

bool AsyncPolicy::PullMayProceed(const ShardView& shard, int, int64_t min_version) const {
  return shard.version >= min_version;
}

}  // namespace pst
