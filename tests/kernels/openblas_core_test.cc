// OpenBLAS's kernels: the correction of its guess for a CPU it does not
// know, and the worker binary computing with kernels for the CPU it runs on
// (and with the user's, where OPENBLAS_CORETYPE names them).
#include "kernels/openblas_core.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr CpuFeatures kSse3{};
constexpr CpuFeatures kAvx{.avx = true};
constexpr CpuFeatures kAvx2{.avx = true, .avx2 = true};
constexpr CpuFeatures kAvx512{.avx = true, .avx2 = true, .avx512 = true};
constexpr CpuFeatures kAvx512Bf16{.avx = true, .avx2 = true, .avx512 = true, .avx512_bf16 = true};

TEST(BetterOpenBlasCoreTest, AnUnknownCpuGetsTheKernelsOfItsWidestInstructions) {
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx512Bf16), "Cooperlake");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx512), "SkylakeX");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx2), "Haswell");
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kAvx), "SandyBridge");
  EXPECT_EQ(BetterOpenBlasCore("PRESCOTT", kAvx2), "Haswell");
}

TEST(BetterOpenBlasCoreTest, KeepsWhatOpenBlasChoseForACpuItKnowsOrThatHasNoMore) {
  EXPECT_EQ(BetterOpenBlasCore("Prescott", kSse3), "");
  // A choice below the CPU's widest instructions can be OpenBLAS's own
  // judgement (AMD's cores get Haswell-era or Zen kernels): not second-guessed.
  EXPECT_EQ(BetterOpenBlasCore("Haswell", kAvx512Bf16), "");
  EXPECT_EQ(BetterOpenBlasCore("Zen", kAvx512), "");
  EXPECT_EQ(BetterOpenBlasCore("Cooperlake", kAvx512Bf16), "");
}

// The worker's log after a start with no PS to answer (it gives up after
// 1 s, exit 2), with OPENBLAS_CORETYPE as `coretype` (unset where null),
// started through `loader` where one is given (as the relocatable bundle
// starts it).
std::string WorkerLog(const char* coretype, const std::string& loader = "") {
  const std::string log_path =
      absl::StrCat(::testing::TempDir(), "/openblas_core_test.", getpid(), ".log");
  const std::string env = coretype == nullptr ? "env -u OPENBLAS_CORETYPE"
                                              : absl::StrCat("env OPENBLAS_CORETYPE=", coretype);
  const std::string through =
      loader.empty() ? "" : absl::StrCat(loader, " --library-path ", "/lib/x86_64-linux-gnu ");
  const std::string line =
      absl::StrCat(env, " timeout -k 5 60 ", through, PST_BIN_DIR,
                   "/worker --task=worker:0 --device=cpu --connect_timeout_seconds=1 >", log_path,
                   " 2>&1 </dev/null");
  const int status = std::system(line.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  std::ifstream in(log_path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(log_path);
  return text.str();
}

// Where OpenBLAS took this CPU for a Prescott (it did in this test process
// unless OPENBLAS_CORETYPE was set for it), the worker computes with the
// kernels BetterOpenBlasCore names; elsewhere with what OpenBLAS chose.
TEST(WorkerOpenBlasTest, ACpuWorkerComputesWithKernelsForThisCpu) {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << set
                 << " in this test's environment hides what OpenBLAS chooses alone";
  }
  const std::string here = OpenBlasCore();
  const std::string better = BetterOpenBlasCore(here, ThisCpuFeatures());
  const std::string expected =
      better.empty() ? absl::StrCat("CPU matrix products: OpenBLAS's ", here, " kernels\n")
                     : absl::StrCat("CPU matrix products: OpenBLAS's ", better,
                                    " kernels (OPENBLAS_CORETYPE)");
  EXPECT_THAT(WorkerLog(nullptr), HasSubstr(expected));
}

// The relocatable bundle starts its programs through its own copy of the
// dynamic loader, with the loader's options before the program: a restart
// runs through the loader again, with those options.
TEST(WorkerOpenBlasTest, AWorkerStartedThroughTheLoaderRestartsThroughIt) {
  constexpr const char* kLoader = "/lib64/ld-linux-x86-64.so.2";
  if (!std::filesystem::exists(kLoader)) GTEST_SKIP() << "no " << kLoader << " on this host";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE in this test's environment: the worker does not restart";
  }
  const std::string better = BetterOpenBlasCore(OpenBlasCore(), ThisCpuFeatures());
  if (better.empty()) {
    GTEST_SKIP() << "OpenBLAS chose its " << OpenBlasCore()
                 << " kernels for this CPU itself: the worker does not restart";
  }
  const std::string log = WorkerLog(nullptr, kLoader);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("CPU matrix products: OpenBLAS's ", better,
                                          " kernels (OPENBLAS_CORETYPE)")));
  EXPECT_THAT(log, HasSubstr("worker:0 computing on 1 tower(s): cpu"));
}

// The worker that executes itself again stays the process its launcher
// started, under its own name (what ps, top and pkill show).
TEST(WorkerOpenBlasTest, ARestartedWorkerKeepsItsProcessAndName) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    GTEST_SKIP() << "OPENBLAS_CORETYPE in this test's environment: the worker does not restart";
  }
  if (BetterOpenBlasCore(OpenBlasCore(), ThisCpuFeatures()).empty()) {
    GTEST_SKIP() << "OpenBLAS chose its " << OpenBlasCore()
                 << " kernels for this CPU itself: the worker does not restart";
  }
  const std::string log_path =
      absl::StrCat(::testing::TempDir(), "/openblas_core_test.", getpid(), ".restart.log");
  const std::string worker = absl::StrCat(PST_BIN_DIR, "/worker");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(log_path.c_str(), "w", stderr);
    freopen(log_path.c_str(), "a", stdout);
    execl(worker.c_str(), "worker", "--task=worker:0", "--device=cpu",
          "--connect_timeout_seconds=120", static_cast<char*>(nullptr));
    _exit(127);
  }
  // The kernels' line comes after the restart.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadFile(log_path).find("CPU matrix products") == std::string::npos &&
         absl::Now() < deadline && !AwaitProcessEnd(pid, absl::Milliseconds(20))) {
  }
  const std::string comm = ReadFile(absl::StrCat("/proc/", pid, "/comm"));
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string log = ReadFile(log_path);
  std::filesystem::remove(log_path);
  EXPECT_THAT(log, HasSubstr("(OPENBLAS_CORETYPE)"));
  EXPECT_EQ(comm, "worker\n");
}

TEST(WorkerOpenBlasTest, TheUsersCoreTypeStands) {
  // Prescott runs on every x86-64 CPU, and is what the worker would replace.
#if !defined(__x86_64__)
  GTEST_SKIP() << "OpenBLAS's Prescott kernels are x86-64's";
#endif
  EXPECT_THAT(WorkerLog("Prescott"),
              HasSubstr("CPU matrix products: OpenBLAS's Prescott kernels (OPENBLAS_CORETYPE)"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
