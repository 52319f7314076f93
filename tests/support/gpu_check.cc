#include "tests/support/gpu_check.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "kernels/device.h"

namespace pst {
namespace {

// The two documented ways to hide every GPU from the CUDA runtime.
bool HidesEveryGpu(const std::optional<std::string>& visible) {
  if (!visible.has_value()) return false;
  const absl::string_view value = absl::StripAsciiWhitespace(*visible);
  return value.empty() || value == "-1";
}

}  // namespace

GpuTestDecision DecideGpuTest(const GpuFacts& facts) {
  const std::string nodes =
      facts.device_nodes.empty() ? "" : absl::StrJoin(facts.device_nodes, ", ");
  if (!facts.cuda_compiled_in) {
    return {GpuTestVerdict::kSkip,
            absl::StrCat("built without CUDA (PS_WITH_CUDA=OFF, or configured without a working "
                         "nvcc)",
                         nodes.empty() ? "" : absl::StrCat("; this machine has ", nodes))};
  }
  if (facts.runtime_gpus > 0) return {GpuTestVerdict::kRun, ""};
  if (HidesEveryGpu(facts.cuda_visible_devices)) {
    return {GpuTestVerdict::kSkip, absl::StrCat("CUDA_VISIBLE_DEVICES=\"",
                                                *facts.cuda_visible_devices,
                                                "\" hides every GPU")};
  }
  if (!nodes.empty()) {
    return {GpuTestVerdict::kFail,
            absl::StrCat(nodes, facts.device_nodes.size() == 1 ? " exists" : " exist",
                         " but the CUDA runtime sees no GPU (",
                         facts.runtime_problem,
                         "): a driver older than this CUDA runtime, or a container without the "
                         "driver's libraries? Set CUDA_VISIBLE_DEVICES= to skip the GPU tests "
                         "on purpose")};
  }
  return {GpuTestVerdict::kSkip,
          absl::StrCat("no NVIDIA GPU on this machine (no /dev/nvidia<N>; ",
                       facts.runtime_problem, ")")};
}

GpuFacts ObserveGpuFacts() {
  GpuFacts facts;
  facts.cuda_compiled_in = CudaCompiledIn();
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", error)) {
    const std::string name = entry.path().filename().string();
    absl::string_view index = name;
    // /dev/nvidia<N> is one GPU; nvidiactl, nvidia-uvm and the like are not.
    if (absl::ConsumePrefix(&index, "nvidia") && !index.empty() &&
        std::all_of(index.begin(), index.end(), absl::ascii_isdigit)) {
      facts.device_nodes.push_back(entry.path().string());
    }
  }
  std::sort(facts.device_nodes.begin(), facts.device_nodes.end());
  facts.runtime_gpus = VisibleGpuCount();
  if (facts.runtime_gpus == 0) facts.runtime_problem = NoGpuReason();
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr) {
    facts.cuda_visible_devices = visible;
  }
  return facts;
}

}  // namespace pst
