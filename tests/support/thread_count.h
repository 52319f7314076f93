// The threads of the test's own process, for tests that a wait holds none.
#ifndef PST_TESTS_SUPPORT_THREAD_COUNT_H_
#define PST_TESTS_SUPPORT_THREAD_COUNT_H_

#include <filesystem>

namespace pst {

inline int ThreadCount() {
  int threads = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ++threads;
  }
  return threads;
}

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_THREAD_COUNT_H_
