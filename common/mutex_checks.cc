#include "common/mutex_checks.h"

#include "absl/synchronization/mutex.h"

namespace pst {

void SkipMutexDeadlockChecks() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace pst
