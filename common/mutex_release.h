// Releases a held absl::Mutex for a scope and takes it back when the scope
// ends, for the part of a locked function that must run outside the lock
// (a long copy others need not wait for). clang's thread-safety analysis
// sees the release and the retake.
#ifndef PST_COMMON_MUTEX_RELEASE_H_
#define PST_COMMON_MUTEX_RELEASE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace pst {

class ABSL_SCOPED_LOCKABLE MutexRelease {
 public:
  explicit MutexRelease(absl::Mutex* mu) ABSL_UNLOCK_FUNCTION(mu) : mu_(mu) { mu_->Unlock(); }
  ~MutexRelease() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_->Lock(); }
  MutexRelease(const MutexRelease&) = delete;
  MutexRelease& operator=(const MutexRelease&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace pst

#endif  // PST_COMMON_MUTEX_RELEASE_H_
