// A scratch directory of one test process: <temp dir>/<name>.<pid>, emptied
// if it exists (not created), and removed with everything in it when the
// process exits normally, so that a test run leaves nothing in /tmp. A
// process where a test failed, or that crashed, leaves it (the logs of the
// processes a test started are there), and a failure says where.
#ifndef PST_TESTS_SUPPORT_FRESH_DIR_H_
#define PST_TESTS_SUPPORT_FRESH_DIR_H_

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"

namespace pst {

inline std::string FreshScratchDir(const std::string& name) {
  // Only by the process that made them: a forked child that exits runs
  // this too.
  struct RemovedAtExit {
    pid_t owner = getpid();
    std::vector<std::string> dirs;
    ~RemovedAtExit() {
      if (getpid() != owner) return;
      if (::testing::UnitTest::GetInstance()->Failed()) {
        for (const std::string& dir : dirs) {
          std::fprintf(stderr, "kept %s: a test failed\n", dir.c_str());
        }
        return;
      }
      std::error_code ignored;
      for (const std::string& dir : dirs) std::filesystem::remove_all(dir, ignored);
    }
  };
  static RemovedAtExit removed;
  std::string dir =
      (std::filesystem::temp_directory_path() / name).string() + "." + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  removed.dirs.push_back(dir);
  return dir;
}

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_FRESH_DIR_H_
