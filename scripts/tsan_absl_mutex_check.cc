// Self-check of scripts/tsan_absl_mutex.cc, run by scripts/sanitize.sh before
// the TSan tests: with the wrappers linked in, TSan must stay silent about
// state handed over through absl::Mutex, CondVar and Notification, and about
// a wait condition that another thread evaluates inside the library as it
// unlocks, reading the waiter's stack, which the waiter writes again once it
// returns ("locked"); it must still report the same counter bumped without
// the lock ("racy").
// If the wrappers stopped taking effect (an absl that inlines Lock, a
// changed symbol), the first fails; if they hid real races, the second does.
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

int main(int argc, char** argv) {
  const bool racy = argc > 1 && std::strcmp(argv[1], "racy") == 0;
  absl::Mutex mu;
  absl::CondVar done_cv;
  absl::Notification go;
  int handed_over = 0;  // written before Notify, read after the wait
  int counter = 0;      // guarded by mu, except in the racy run
  bool done = false;    // guarded by mu
  // Orders the two threads' increments in time without telling TSan (relaxed
  // atomics are no synchronization to it), so that the racy run overlaps
  // main's critical sections on every schedule, not only on some.
  std::atomic<bool> main_counted{false};

  std::thread other([&] {
    go.WaitForNotification();
    const int seen = handed_over;
    while (!main_counted.load(std::memory_order_relaxed)) std::this_thread::yield();
    for (int i = 0; i < 1000; ++i) {
      if (racy) {
        ++counter;
      } else {
        absl::MutexLock lock(&mu);
        ++counter;
      }
    }
    absl::MutexLock lock(&mu);
    done = seen == 42;
    done_cv.SignalAll();
  });
  handed_over = 42;
  go.Notify();
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock lock(&mu);
    ++counter;
  }
  main_counted.store(true, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu);
    while (!done) done_cv.Wait(&mu);
  }
  other.join();

  // The waiter's condition reads threshold, on its stack; the waker makes
  // the condition true only after it has evaluated it once itself (inside
  // absl's Unlock), and the waiter then writes threshold again.
  bool ready = false;  // guarded by mu
  int threshold = 1;
  std::atomic<bool> evaluated_by_waker{false};  // no synchronization to TSan
  const std::thread::id waiter = std::this_thread::get_id();
  const auto holds = [&] {
    if (std::this_thread::get_id() != waiter) {
      evaluated_by_waker.store(true, std::memory_order_relaxed);
    }
    return ready && threshold == 1;
  };
  std::thread waker([&] {
    for (;;) {
      absl::MutexLock lock(&mu);
      if (evaluated_by_waker.load(std::memory_order_relaxed)) {
        ready = true;
        return;
      }
    }
  });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&holds));
  }
  threshold = 2;
  waker.join();
  return threshold == 2 ? 0 : 1;
}
