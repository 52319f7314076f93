#include "consistency/ssp_policy.h"

#include <algorithm>
#include <limits>

namespace pst {

bool SspPolicy::PullMayProceed(const ShardView& shard, int worker, int64_t min_version) const {
  if (!AsyncPolicy::PullMayProceed(shard, worker, min_version)) return false;
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const WorkerProgress& w : shard.workers) {
    if (w.live && !w.done) slowest = std::min(slowest, w.clock);
  }
  return shard.workers[worker].clock - slowest <= staleness_;
}

}  // namespace pst
