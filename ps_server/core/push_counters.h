// What became of the pushes a shard received, as its Stats report them.
#ifndef PST_PS_SERVER_CORE_PUSH_COUNTERS_H_
#define PST_PS_SERVER_CORE_PUSH_COUNTERS_H_

#include <cstdint>

#include "ps.pb.h"

namespace pst {

struct PushCounters {
  // Pushes applied on their own and completed SYNC steps: each advanced
  // the version by one.
  int64_t applied = 0;
  // Pushes summed into a step that was not complete yet.
  int64_t aggregated = 0;
  int64_t dropped = 0;
  // Refused: invalid, or an update that would have made the model
  // non-finite.
  int64_t rejected = 0;
  // Repeats of pushes already taken (PushResponse::DUPLICATE).
  int64_t repeated = 0;

  void AddStats(StatsResponse* response) const {
    response->set_pushes_applied(applied);
    response->set_pushes_aggregated(aggregated);
    response->set_pushes_dropped(dropped);
    response->set_pushes_rejected(rejected);
    response->set_pushes_repeated(repeated);
  }
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_PUSH_COUNTERS_H_
