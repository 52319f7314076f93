// The run / skip / fail decision of every GPU test, from injected facts:
// no GPU is needed to check it.
#include "tests/support/gpu_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(GpuCheckTest, RunsSkipsOrFailsAsTheMachineDeserves) {
  struct Case {
    std::string name;
    GpuFacts facts;
    GpuTestVerdict verdict;
    std::vector<std::string> reason_mentions;
  };
  const std::string no_device = "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device";
  const std::string old_driver =
      "cudaGetDeviceCount: cudaErrorInsufficientDriver: CUDA driver version is insufficient";
  const std::vector<Case> cases = {
      {"a GPU the runtime sees", {true, {"/dev/nvidia0"}, 1, "", std::nullopt},
       GpuTestVerdict::kRun, {}},
      {"the runtime decides, even without a node (e.g. WSL)", {true, {}, 2, "", std::nullopt},
       GpuTestVerdict::kRun, {}},
      {"a build without CUDA", {false, {}, 0, "this build has no CUDA support", std::nullopt},
       GpuTestVerdict::kSkip, {"built without CUDA"}},
      {"a build without CUDA on a GPU machine says so",
       {false, {"/dev/nvidia0"}, 0, "this build has no CUDA support", std::nullopt},
       GpuTestVerdict::kSkip, {"built without CUDA", "/dev/nvidia0"}},
      {"no GPU at all", {true, {}, 0, no_device, std::nullopt}, GpuTestVerdict::kSkip,
       {"no /dev/nvidia<N>", "cudaErrorNoDevice"}},
      {"a node but a driver too old for the runtime",
       {true, {"/dev/nvidia0"}, 0, old_driver, std::nullopt}, GpuTestVerdict::kFail,
       {"/dev/nvidia0 exists", "cudaErrorInsufficientDriver"}},
      {"nodes but no device for the runtime",
       {true, {"/dev/nvidia0", "/dev/nvidia1"}, 0, no_device, "0,1"}, GpuTestVerdict::kFail,
       {"/dev/nvidia0, /dev/nvidia1 exist", "cudaErrorNoDevice"}},
      {"GPUs hidden on purpose with an empty CUDA_VISIBLE_DEVICES",
       {true, {"/dev/nvidia0"}, 0, no_device, ""}, GpuTestVerdict::kSkip,
       {"CUDA_VISIBLE_DEVICES=\"\" hides every GPU"}},
      {"GPUs hidden on purpose with CUDA_VISIBLE_DEVICES=-1",
       {true, {"/dev/nvidia0"}, 0, no_device, "-1"}, GpuTestVerdict::kSkip,
       {"CUDA_VISIBLE_DEVICES=\"-1\""}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const GpuTestDecision decision = DecideGpuTest(c.facts);
    EXPECT_EQ(decision.verdict, c.verdict) << decision.reason;
    if (c.verdict == GpuTestVerdict::kRun) {
      EXPECT_EQ(decision.reason, "");
    }
    for (const std::string& mention : c.reason_mentions) {
      EXPECT_THAT(decision.reason, HasSubstr(mention));
    }
  }
}

TEST(GpuCheckTest, TheObservedFactsAreConsistent) {
  const GpuFacts facts = ObserveGpuFacts();
  for (const std::string& node : facts.device_nodes) {
    EXPECT_THAT(node, AllOf(HasSubstr("/dev/nvidia"), ::testing::Not(HasSubstr("ctl"))));
  }
  if (facts.runtime_gpus == 0) {
    EXPECT_NE(facts.runtime_problem, "");
  } else {
    EXPECT_TRUE(facts.cuda_compiled_in);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
