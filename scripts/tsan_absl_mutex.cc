// ThreadSanitizer annotations for absl::Mutex, absl::CondVar and
// absl::Notification, linked into the TSan build by scripts/sanitize.sh.
//
// Why: Debian's libabsl_synchronization.so is not built with TSan, and
// absl::Mutex blocks on futexes rather than pthreads, so TSan sees no
// happens-before edge between a thread that unlocks a mutex and the next one
// that locks it, and reports every mutex-protected field as a race.
// The link flag -Wl,--wrap=SYM sends every call that our objects make to SYM
// to __wrap_SYM below, which calls the library (__real_SYM) and tells TSan
// what the call means for memory ordering:
//   lock (returns holding mu)   -> __tsan_acquire(mu) after the call
//   unlock                      -> __tsan_release(mu) before the call
//   wait (gives mu up, retakes) -> __tsan_release(mu) before, acquire after
//   a wait condition, evaluated -> acquire(mu) before, release(mu) after
//   Notify / WaitForNotification* -> release / acquire on the Notification.
// The last because absl evaluates a condition inside the library, with mu
// held: in the waiter as it wakes, before the wrapper's acquire, and in
// whichever thread unlocks mu, after that thread's release. The condition
// reads guarded state and the waiter's stack (its lambda's captures), which
// the waiter writes again once it returns. Every evaluation ends before the
// waiter returns (the library dequeues it first), so an acquire and a
// release around each evaluation and the waiter's acquire on return order
// those reads; without them TSan reports them.
// Calls from inside the uninstrumented libraries are not redirected; TSan
// sees neither their accesses nor their locks, so they need nothing.
//
// The symbol names are mangled with Debian's inline namespace (absl::debian3);
// the static_assert below stops the build when a new libabsl changes it. The
// lines "// wrap: SYM" are read by scripts/sanitize.sh to make the link flags.
#include <string_view>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define PST_STRINGIFY_INNER(x) #x
#define PST_STRINGIFY(x) PST_STRINGIFY_INNER(x)
static_assert(std::string_view(PST_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME)) == "debian3",
              "libabsl's inline namespace changed: update the mangled names in this file");

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}

namespace {

using absl::CondVar;
using absl::Condition;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

void Acquire(const void* addr) { __tsan_acquire(const_cast<void*>(addr)); }
void Release(const void* addr) { __tsan_release(const_cast<void*>(addr)); }

// A wait condition evaluated as if it took mu for the evaluation. It lives on the
// waiter's stack for the whole wait, and is set before the wait gives mu up.
struct AnnotatedCondition {
  const Condition* condition;
  const Mutex* mu;
};

bool EvalUnderMu(AnnotatedCondition* annotated) {
  Acquire(annotated->mu);
  const bool holds = annotated->condition->Eval();
  Release(annotated->mu);
  return holds;
}

}  // namespace

// Calls that return holding the lock (or having seen the notification).
#define PST_ACQUIRE_AFTER(sym, params, args, obj) \
  extern "C" void __real_##sym params;            \
  extern "C" void __wrap_##sym params {           \
    __real_##sym args;                            \
    Acquire(obj);                                 \
  }
// The same where the result says whether they did.
#define PST_ACQUIRE_IF_TRUE(sym, params, args, obj) \
  extern "C" bool __real_##sym params;              \
  extern "C" bool __wrap_##sym params {             \
    const bool done = __real_##sym args;            \
    if (done) Acquire(obj);                         \
    return done;                                    \
  }
// Calls that give the lock up (or publish the notification).
#define PST_RELEASE_BEFORE(sym, params, args, obj) \
  extern "C" void __real_##sym params;             \
  extern "C" void __wrap_##sym params {            \
    Release(obj);                                  \
    __real_##sym args;                             \
  }
// Calls that give the lock up while they wait and return holding it again.
#define PST_WAIT(sym, Ret, params, args, obj) \
  extern "C" Ret __real_##sym params;         \
  extern "C" Ret __wrap_##sym params {        \
    Release(obj);                             \
    struct Reacquire {                        \
      const void* obj;                        \
      ~Reacquire() { Acquire(obj); }          \
    } reacquire{obj};                         \
    return __real_##sym args;                 \
  }
// Calls that wait for a condition, which the library evaluates through an
// AnnotatedCondition (real_args pass &annotated for it), and return holding
// the lock. holding: whether the caller holds mu already (Await*), which
// it gives up while it waits, or not (LockWhen*).
#define PST_WAIT_FOR(sym, Ret, params, real_args, mu, c, holding) \
  extern "C" Ret __real_##sym params;                             \
  extern "C" Ret __wrap_##sym params {                            \
    AnnotatedCondition context{c, mu};                            \
    const Condition annotated(&EvalUnderMu, &context);            \
    if (holding) Release(mu);                                     \
    struct Reacquire {                                            \
      const void* obj;                                            \
      ~Reacquire() { Acquire(obj); }                              \
    } reacquire{mu};                                              \
    return __real_##sym real_args;                                \
  }

// wrap: _ZN4absl7debian35Mutex4LockEv
PST_ACQUIRE_AFTER(_ZN4absl7debian35Mutex4LockEv, (Mutex * mu), (mu), mu)
// wrap: _ZN4absl7debian35Mutex10ReaderLockEv
PST_ACQUIRE_AFTER(_ZN4absl7debian35Mutex10ReaderLockEv, (Mutex * mu), (mu), mu)
// wrap: _ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE
PST_WAIT_FOR(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE, void,
             (Mutex * mu, const Condition* c), (mu, &annotated), mu, c, false)
// wrap: _ZN4absl7debian35Mutex7TryLockEv
PST_ACQUIRE_IF_TRUE(_ZN4absl7debian35Mutex7TryLockEv, (Mutex * mu), (mu), mu)
// wrap: _ZN4absl7debian35Mutex13ReaderTryLockEv
PST_ACQUIRE_IF_TRUE(_ZN4absl7debian35Mutex13ReaderTryLockEv, (Mutex * mu), (mu), mu)
// wrap: _ZN4absl7debian35Mutex6UnlockEv
PST_RELEASE_BEFORE(_ZN4absl7debian35Mutex6UnlockEv, (Mutex * mu), (mu), mu)
// wrap: _ZN4absl7debian35Mutex12ReaderUnlockEv
PST_RELEASE_BEFORE(_ZN4absl7debian35Mutex12ReaderUnlockEv, (Mutex * mu), (mu), mu)

// LockWhen* and Await* hold the lock on return, whatever they return.
// wrap: _ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE
PST_WAIT_FOR(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE, bool,
             (Mutex * mu, const Condition* c, Duration d), (mu, &annotated, d), mu, c, false)
// wrap: _ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE
PST_WAIT_FOR(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE, bool,
             (Mutex * mu, const Condition* c, Time t), (mu, &annotated, t), mu, c, false)
// wrap: _ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE
PST_WAIT_FOR(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE, void, (Mutex * mu, const Condition* c),
             (mu, &annotated), mu, c, true)
// wrap: _ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE
PST_WAIT_FOR(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE, bool,
             (Mutex * mu, const Condition* c, Duration d), (mu, &annotated, d), mu, c, true)
// wrap: _ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE
PST_WAIT_FOR(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE, bool,
             (Mutex * mu, const Condition* c, Time t), (mu, &annotated, t), mu, c, true)
// wrap: _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE
PST_WAIT(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE, void, (CondVar * cv, Mutex* mu), (cv, mu),
         mu)
// wrap: _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE
PST_WAIT(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE, bool,
         (CondVar * cv, Mutex* mu, Duration d), (cv, mu, d), mu)
// wrap: _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE
PST_WAIT(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE, bool,
         (CondVar * cv, Mutex* mu, Time t), (cv, mu, t), mu)

// Notification: Notify publishes, a wait that saw it subscribes.
// HasBeenNotified() is inline (an instrumented acquire load of a flag that
// Notify stores in the library), so a poll on it gives no edge; our pollers
// (Checkpointer::Loop, the PS signal waiter) are joined before their state
// is read, and the join is an edge TSan sees.
// wrap: _ZN4absl7debian312Notification6NotifyEv
PST_RELEASE_BEFORE(_ZN4absl7debian312Notification6NotifyEv, (Notification * n), (n), n)
// wrap: _ZNK4absl7debian312Notification19WaitForNotificationEv
PST_ACQUIRE_AFTER(_ZNK4absl7debian312Notification19WaitForNotificationEv,
                  (const Notification* n), (n), n)
// wrap: _ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE
PST_ACQUIRE_IF_TRUE(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE,
                    (const Notification* n, Duration d), (n, d), n)
// wrap: _ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE
PST_ACQUIRE_IF_TRUE(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE,
                    (const Notification* n, Time t), (n, t), n)
