// OpenBLAS's kernels: the correction of its guess for a CPU it does not
// know, the worker binary computing with kernels for the CPU it runs on
// (and with the user's, where OPENBLAS_CORETYPE names them), and the
// restart that gives a program the variable (ExecAgainWith).
#include "kernels/openblas_core.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
// 1 s, exit 2), with OPENBLAS_CORETYPE as `coretype` (unset where null).
std::string WorkerLog(const char* coretype) {
  const std::string log_path =
      absl::StrCat(::testing::TempDir(), "/openblas_core_test.", getpid(), ".log");
  const std::string env = coretype == nullptr ? "env -u OPENBLAS_CORETYPE"
                                              : absl::StrCat("env OPENBLAS_CORETYPE=", coretype);
  const std::string line =
      absl::StrCat(env, " timeout -k 5 60 ", PST_BIN_DIR,
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

// Where OpenBLAS took this CPU for a Prescott, the worker computes with the
// kernels BetterOpenBlasCore names; elsewhere with what OpenBLAS chose.
TEST(WorkerOpenBlasTest, ACpuWorkerComputesWithKernelsForThisCpu) {
  // What OpenBLAS chose alone in this process: ctest runs every test
  // without OPENBLAS_CORETYPE (tests/CMakeLists.txt).
  ASSERT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr)
      << "run this test without OPENBLAS_CORETYPE, as ctest does";
  const std::string here = OpenBlasCore();
  const std::string better = BetterOpenBlasCore(here, ThisCpuFeatures());
  const std::string expected =
      better.empty() ? absl::StrCat("CPU matrix products: OpenBLAS's ", here, " kernels\n")
                     : absl::StrCat("CPU matrix products: OpenBLAS's ", better,
                                    " kernels (OPENBLAS_CORETYPE)");
  EXPECT_THAT(WorkerLog(nullptr), HasSubstr(expected));
}

TEST(WorkerOpenBlasTest, TheUsersCoreTypeStands) {
#if defined(__x86_64__)
  // Prescott runs on every x86-64 CPU, and is what the worker would replace.
  const std::string users = "Prescott";
#else
  const std::string users = OpenBlasCore();
#endif
  EXPECT_THAT(WorkerLog(users.c_str()),
              HasSubstr(absl::StrCat("CPU matrix products: OpenBLAS's ", users,
                                     " kernels (OPENBLAS_CORETYPE)")));
}

// What exec_probe (tests/support) prints, started with `command` (its path
// and arguments, after a loader and its options where one is given) from a
// child of this process; the child's PID in `pid`.
std::string ProbeOutput(std::vector<std::string> command, pid_t* pid) {
  const std::string out_path =
      absl::StrCat(::testing::TempDir(), "/openblas_core_test.", getpid(), ".probe");
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  *pid = fork();
  if (*pid == 0) {
    unsetenv("PST_EXEC_AGAIN");
    if (freopen(out_path.c_str(), "w", stdout) == nullptr) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  EXPECT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string out = ReadFile(out_path);
  std::filesystem::remove(out_path);
  return out;
}

// A program that executes itself again stays the process its launcher
// started, under its own name (what ps, top and pkill show), with its
// arguments and the variable set.
TEST(ExecAgainWithTest, KeepsTheProcessItsNameAndItsArguments) {
  pid_t pid = 0;
  const std::string out = ProbeOutput({PST_EXEC_PROBE, "--flag=1", "word"}, &pid);
  EXPECT_EQ(
      out, absl::StrCat("pid ", pid, " name exec_probe PST_EXEC_AGAIN=again args --flag=1 word\n"));
}

// The relocatable bundle starts its programs through its own copy of the
// dynamic loader, with the loader's options before the program: executed
// again, the program runs through the loader again, with those options.
TEST(ExecAgainWithTest, AProgramStartedThroughTheLoaderRunsThroughItAgain) {
  // This test's own loader (the object loaded at the kernel's AT_BASE, or
  // the program itself where this test was started through it) and the
  // folder of its C library, whatever the host names them.
  std::string loader;
  if (getauxval(AT_BASE) == 0) {
    loader = std::filesystem::read_symlink("/proc/self/exe").string();
  } else {
    dl_iterate_phdr(
        [](dl_phdr_info* object, size_t, void* found) {
          if (object->dlpi_addr != getauxval(AT_BASE)) return 0;
          *static_cast<std::string*>(found) = object->dlpi_name;
          return 1;
        },
        &loader);
  }
  ASSERT_FALSE(loader.empty()) << "this test runs without a dynamic loader";
  Dl_info libc{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&std::printf), &libc), 0);
  const std::string library_dir = std::filesystem::path(libc.dli_fname).parent_path().string();
  pid_t pid = 0;
  const std::string out =
      ProbeOutput({loader, "--library-path", library_dir, PST_EXEC_PROBE, "--flag=1"}, &pid);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("pid ", pid, " ")));
  EXPECT_THAT(out, HasSubstr("PST_EXEC_AGAIN=again args --flag=1\n"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
