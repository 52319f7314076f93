#include "kernels/openblas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "spdlog/spdlog.h"

namespace pst {

CpuFeatures ThisCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__)
  // GCC's checks include the OS's: AVX-512 counts only where the kernel
  // saves its registers.
  cpu.avx = __builtin_cpu_supports("avx");
  cpu.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  cpu.avx512_bf16 = cpu.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return cpu;
}

std::string OpenBlasCore() {
  const char* name = openblas_get_corename();
  return name == nullptr ? std::string() : std::string(name);
}

std::string BetterOpenBlasCore(std::string_view chosen, const CpuFeatures& cpu) {
  // Prescott is where OpenBLAS lands for any x86-64 model it does not
  // know; a CPU it knows keeps what OpenBLAS chose for it.
  if (!absl::EqualsIgnoreCase(absl::string_view(chosen.data(), chosen.size()), "Prescott")) {
    return {};
  }
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2) return "Haswell";
  if (cpu.avx) return "SandyBridge";
  return {};
}

namespace {

// The command line the kernel started this process with (/proc/self/cmdline):
// under an explicit loader (the relocatable bundle starts its programs as
// `ld-linux... --library-path DIR libexec/worker ARGS`) it holds the loader's
// arguments too, which main()'s argv no longer shows.
std::vector<std::string> StartedCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  return args;
}

}  // namespace

int ExecAgainWith(const char* name, const std::string& value) {
  // The file the kernel started (the program, or the loader that runs it),
  // by its own path: executing /proc/self/exe would name the process "exe"
  // (what ps, top and pkill show).
  std::error_code unreadable;
  const std::filesystem::path file = std::filesystem::read_symlink("/proc/self/exe", unreadable);
  if (unreadable) return unreadable.value();
  std::vector<std::string> args = StartedCommandLine();
  if (args.empty()) return ENOENT;
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  setenv(name, value.c_str(), /*overwrite=*/1);
  execv(file.c_str(), argv.data());
  const int error = errno;
  // Still the first image: the variable goes, so that a child does not
  // start with it while this process runs without its effect.
  unsetenv(name);
  return error;
}

void ExecAgainWithBetterOpenBlasKernels() {
  constexpr const char* kSwitch = "OPENBLAS_CORETYPE";
  if (std::getenv(kSwitch) != nullptr) return;  // the user's choice, or ours already
  const std::string chosen = OpenBlasCore();
  const std::string better = BetterOpenBlasCore(chosen, ThisCpuFeatures());
  if (better.empty()) return;
  const int error = ExecAgainWith(kSwitch, better);
  spdlog::warn(
      "OpenBLAS took this CPU for a {0}; restarting with OPENBLAS_CORETYPE={1} failed ({2}), "
      "so matrix products run on its {0} kernels: set OPENBLAS_CORETYPE={1} in the environment",
      chosen, better, std::strerror(error));
}

}  // namespace pst
