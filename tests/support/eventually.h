// Waiting in tests for a condition that nothing signals: a counter of the
// code under test, a file another process writes, a line in its log, what
// its Stats or metrics say. Where the code offers a notification, a
// condition variable or waitpid, wait on that instead.
#ifndef PST_TESTS_SUPPORT_EVENTUALLY_H_
#define PST_TESTS_SUPPORT_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pst {

// Checks `condition` every `every` until it holds (true) or `timeout` has
// passed (false, after a last check). The timeout bounds a test that would
// otherwise hang: make it generous, and fail the test when it runs out.
template <typename Condition>
bool Eventually(Condition condition, absl::Duration timeout = absl::Seconds(20),
                absl::Duration every = absl::Milliseconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return condition();
    absl::SleepFor(every);
  }
  return true;
}

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_EVENTUALLY_H_
