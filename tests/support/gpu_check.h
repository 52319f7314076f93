// Whether a GPU test runs, is skipped or fails, decided in one place for
// every GPU test. A test is skipped only where there is no GPU to test
// (the build has no CUDA, the machine has no NVIDIA device node, or
// CUDA_VISIBLE_DEVICES hides every GPU), and the skip says which. A machine
// with a /dev/nvidia<N> node whose CUDA runtime sees no GPU (a driver older
// than the runtime, a container without the driver libraries) fails the
// test: such a machine must not pass the GPU suite by skipping it.
//
// Use PST_REQUIRE_GPU() at the top of a test body or SetUp().
#ifndef PST_TESTS_SUPPORT_GPU_CHECK_H_
#define PST_TESTS_SUPPORT_GPU_CHECK_H_

#include <optional>
#include <string>
#include <vector>

namespace pst {

// What the decision depends on, gathered by ObserveGpuFacts() or, in the
// decision's own tests, written by hand.
struct GpuFacts {
  bool cuda_compiled_in = false;
  std::vector<std::string> device_nodes;  // "/dev/nvidia0", ...: one per GPU the kernel driver has
  int runtime_gpus = 0;                   // what the CUDA runtime counts
  std::string runtime_problem;            // why runtime_gpus is 0 (NoGpuReason())
  std::optional<std::string> cuda_visible_devices;  // unset: nullopt
};

enum class GpuTestVerdict { kRun, kSkip, kFail };

struct GpuTestDecision {
  GpuTestVerdict verdict = GpuTestVerdict::kSkip;
  std::string reason;  // empty for kRun
};

GpuTestDecision DecideGpuTest(const GpuFacts& facts);

// The facts of this process: the build, /dev/nvidia<N>, the CUDA runtime
// and the environment.
GpuFacts ObserveGpuFacts();

}  // namespace pst

// Skips (with the reason) or fails the current test unless a GPU is there
// to test. Returns from the enclosing function when it does not run on.
#define PST_REQUIRE_GPU()                                                              \
  do {                                                                                 \
    const ::pst::GpuTestDecision pst_gpu_decision =                                    \
        ::pst::DecideGpuTest(::pst::ObserveGpuFacts());                                \
    if (pst_gpu_decision.verdict == ::pst::GpuTestVerdict::kSkip) {                    \
      GTEST_SKIP() << pst_gpu_decision.reason;                                         \
    }                                                                                  \
    if (pst_gpu_decision.verdict == ::pst::GpuTestVerdict::kFail) {                    \
      FAIL() << pst_gpu_decision.reason;                                               \
    }                                                                                  \
  } while (false)

#endif  // PST_TESTS_SUPPORT_GPU_CHECK_H_
