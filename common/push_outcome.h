// What a PushResponse's outcome says about the shard's version, for the
// staleness both ends compute from it.
#ifndef PST_COMMON_PUSH_OUTCOME_H_
#define PST_COMMON_PUSH_OUTCOME_H_

#include "ps.pb.h"

namespace pst {

// Whether the push moved the version by one: it was applied, or it
// completed a SYNC step (applied or, when the step would have overflowed,
// skipped).
inline bool AdvancedTheVersion(PushResponse::Outcome outcome) {
  return outcome == PushResponse::APPLIED || outcome == PushResponse::SKIPPED;
}

}  // namespace pst

#endif  // PST_COMMON_PUSH_OUTCOME_H_
