// Abseil's lock-order (deadlock) checks, off in the programs users run.
//
// Debian's libabsl is built without NDEBUG, so by default every
// absl::Mutex acquisition also records lock-order edges in a global graph
// (synchronization_internal::GraphCycles) and aborts the process on a
// cycle: measured at about 4x the cost of an uncontended nested lock pair
// (72-96 ns against 18-19 ns), on every lock of every step. The programs
// users run (ps_server, worker, pslaunch, the benchmarks, the Python
// module) turn the checks off first thing in main; the test binaries keep
// them, and lock order is also checked by TSan and clang's thread-safety
// analysis (scripts/sanitize.sh, scripts/lint.sh).
#ifndef PST_COMMON_MUTEX_CHECKS_H_
#define PST_COMMON_MUTEX_CHECKS_H_

namespace pst {

// Turns absl::Mutex deadlock detection off for the process. Call it before
// the first lock is taken (first thing in main).
void SkipMutexDeadlockChecks();

}  // namespace pst

#endif  // PST_COMMON_MUTEX_CHECKS_H_
