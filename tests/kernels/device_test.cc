// Device choice: parsing --device / training.device, resolving "auto", and a
// GPU that is not there being one clear error (from the library and from the
// worker binary, exit code 2). Runs with or without a GPU.
#include "kernels/device.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/overrides.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/gpu_check.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(DeviceSpecTest, AcceptsAutoCpuAndGpuN) {
  struct Good {
    std::string text;
    DeviceSpec::Kind kind;
    int gpu;
    std::string canonical;
  };
  for (const Good& g : {Good{"", DeviceSpec::Kind::kAuto, 0, "auto"},
                        Good{"auto", DeviceSpec::Kind::kAuto, 0, "auto"},
                        Good{"cpu", DeviceSpec::Kind::kCpu, 0, "cpu"},
                        Good{"gpu:0", DeviceSpec::Kind::kGpu, 0, "gpu:0"},
                        Good{"gpu:12", DeviceSpec::Kind::kGpu, 12, "gpu:12"}}) {
    SCOPED_TRACE(g.text);
    absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(g.text);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->kind, g.kind);
    EXPECT_EQ(spec->gpu, g.gpu);
    EXPECT_EQ(spec->ToString(), g.canonical);
  }
}

TEST(DeviceSpecTest, RejectsAnythingElseNamingIt) {
  for (const char* bad : {"gpu", "gpu:", "gpu:-1", "gpu:x", "gpu:0 ", "GPU:0", "cuda:0", "tpu",
                          "gpu:99999999999"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(bad);
    ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(absl::StrCat("\"", bad, "\"")));
    EXPECT_THAT(spec.status().message(), HasSubstr("auto, cpu or gpu:N"));
  }
}

TEST(DeviceListTest, ParsesTowersInOrder) {
  struct Good {
    std::string text;
    size_t towers;
    bool every_gpu;
    std::string canonical;
  };
  for (const Good& g : {Good{"", 0, false, ""}, Good{"cpu", 1, false, "cpu"},
                        Good{"cpu:2", 2, false, "cpu:2"}, Good{"cpu, cpu", 2, false, "cpu:2"},
                        Good{"gpu:0,gpu:1", 2, false, "gpu:0,gpu:1"},
                        Good{"gpu:1,cpu", 2, false, "gpu:1,cpu"},
                        Good{"gpu:all", 0, true, "gpu:all"}}) {
    SCOPED_TRACE(g.text);
    absl::StatusOr<DeviceList> list = ParseDeviceList(g.text);
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_EQ(list->towers.size(), g.towers);
    EXPECT_EQ(list->every_gpu, g.every_gpu);
    if (!g.text.empty()) {
      EXPECT_EQ(list->ToString(), g.canonical);
    }
  }
  absl::StatusOr<DeviceList> mixed = ParseDeviceList("gpu:1,cpu");
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->towers[0].kind, DeviceSpec::Kind::kGpu);
  EXPECT_EQ(mixed->towers[0].gpu, 1);
  EXPECT_EQ(mixed->towers[1].kind, DeviceSpec::Kind::kCpu);
}

TEST(DeviceListTest, RejectsBadItemsNamingThem) {
  for (const char* bad : {"cpu:0", "cpu:x", "cpu:65", "gpu", "gpu:x", "tpu", "gpu:all,cpu",
                          "cpu:40,cpu:40", "cpu,"}) {
    SCOPED_TRACE(bad);
    absl::StatusOr<DeviceList> list = ParseDeviceList(bad);
    ASSERT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(list.status().message(), HasSubstr(absl::StrCat("\"", bad, "\"")));
    EXPECT_THAT(list.status().message(), HasSubstr("cpu, cpu:N, gpu:N"));
  }
}

TEST(DeviceTest, CpuIsAlwaysThere) {
  absl::StatusOr<std::unique_ptr<Kernels>> kernels = MakeKernelsFor({DeviceSpec::Kind::kCpu, 0}, 0);
  ASSERT_TRUE(kernels.ok()) << kernels.status();
  EXPECT_EQ((*kernels)->Name(), "cpu");
}

TEST(DeviceTest, AutoSpreadsWorkersOverTheGpusByRank) {
  struct Case {
    DeviceSpec spec;
    int rank;
    int visible_gpus;
    std::string resolved;
  };
  const DeviceSpec automatic;
  for (const Case& c : {Case{automatic, 0, 0, "cpu"}, Case{automatic, 5, 0, "cpu"},
                        Case{automatic, 0, 1, "gpu:0"}, Case{automatic, 3, 1, "gpu:0"},
                        Case{automatic, 0, 4, "gpu:0"}, Case{automatic, 1, 4, "gpu:1"},
                        Case{automatic, 3, 4, "gpu:3"}, Case{automatic, 4, 4, "gpu:0"},
                        Case{automatic, 7, 3, "gpu:1"}, Case{automatic, 1000003, 8, "gpu:3"},
                        // Only auto is resolved: cpu and gpu:N stay, visible or not.
                        Case{{DeviceSpec::Kind::kCpu, 0}, 3, 4, "cpu"},
                        Case{{DeviceSpec::Kind::kGpu, 2}, 1, 4, "gpu:2"},
                        Case{{DeviceSpec::Kind::kGpu, 2}, 1, 0, "gpu:2"}}) {
    SCOPED_TRACE(absl::StrCat(c.spec.ToString(), " rank ", c.rank, " with ", c.visible_gpus,
                              " GPU(s)"));
    EXPECT_EQ(ResolveDevice(c.spec, c.rank, c.visible_gpus).ToString(), c.resolved);
  }
}

TEST(DeviceTest, AutoPicksTheRanksGpuWhenOneIsVisibleElseTheCpu) {
  const int gpus = VisibleGpuCount();
  for (int rank : {0, 1, 3}) {
    SCOPED_TRACE(rank);
    absl::StatusOr<std::unique_ptr<Kernels>> kernels =
        MakeKernelsFor({DeviceSpec::Kind::kAuto, 0}, rank);
    ASSERT_TRUE(kernels.ok()) << kernels.status();
    EXPECT_EQ((*kernels)->Name(), gpus > 0 ? absl::StrCat("cuda:", rank % gpus) : "cpu");
  }
}

TEST(DeviceTest, AMissingGpuIsAClearError) {
  const int missing = VisibleGpuCount();  // one past the last visible GPU
  absl::StatusOr<std::unique_ptr<Kernels>> kernels =
      MakeKernelsFor({DeviceSpec::Kind::kGpu, missing}, 0);
  ASSERT_FALSE(kernels.ok());
  EXPECT_THAT(kernels.status().code(), ::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                                        absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(kernels.status().message(), HasSubstr(absl::StrCat("gpu:", missing, " requested")));
}

TEST(DeviceConfigTest, TheOverrideAndTheConfigFieldAreValidated) {
  JobConfig config;
  ASSERT_TRUE(ApplyOverrides({*ConfigOverrideOf("device", "gpu:1")}, &config).ok());
  EXPECT_EQ(config.training().device(), "gpu:1");
  absl::Status bad = ApplyOverrides({*ConfigOverrideOf("device", "gpu:one")}, &config);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--device: device \"gpu:one\""));

  absl::StatusOr<JobConfig> parsed = ParseConfig(
      "cluster { ps: \"127.0.0.1:1\" workers: 1 } training { device: \"npu\" "
      "optimizer { sgd { learning_rate: 0.1 } } dataset { parabola { examples: 64 } } "
      "model { mlp { hidden: 4 } } }",
      "test");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ApplyDefaults(&*parsed);
  absl::Status invalid = ValidateConfig(*parsed);
  EXPECT_EQ(invalid.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(invalid.message(), HasSubstr("training.device"));
  parsed->mutable_training()->set_device("cpu");
  EXPECT_TRUE(ValidateConfig(*parsed).ok()) << ValidateConfig(*parsed);
}

struct CommandResult {
  int exit_code = -1;
  std::string err;
};

// Runs bin/<program> with `args`; stderr is kept, stdout dropped.
CommandResult RunBinary(const std::string& program, const std::string& args) {
  static int calls = 0;
  const std::string err_path =
      absl::StrCat(::testing::TempDir(), "/device_test.", getpid(), ".", ++calls, ".err");
  const std::string line = absl::StrCat("timeout -k 5 60 ", PST_BIN_DIR, "/", program, " ", args,
                                        " >/dev/null 2>", err_path, " </dev/null");
  const int status = std::system(line.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream text;
  text << in.rdbuf();
  result.err = text.str();
  std::filesystem::remove(err_path);
  return result;
}

TEST(WorkerDeviceFlagTest, AMissingGpuOrABadValueExitsWithCode2AndOneLine) {
  const std::string missing = absl::StrCat("gpu:", VisibleGpuCount());
  struct Case {
    std::string flag;
    std::string expected;
  };
  for (const Case& c : {Case{"--device=" + missing, missing + " requested"},
                        Case{"--device=" + missing, "use --device=cpu"},
                        Case{"--device=gpu:zero", "--device: device \"gpu:zero\""}}) {
    SCOPED_TRACE(c.flag);
    CommandResult r = RunBinary("worker", "--task=worker:0 --connect_timeout_seconds=1 " + c.flag);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr("worker: error: "));
    EXPECT_THAT(r.err, HasSubstr(c.expected));
    std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), 1u) << r.err;
  }
}

// On a host without an NVIDIA device (no /dev/nvidiactl) a CPU worker's log
// says how many GPUs it sees, and nothing of the CUDA runtime's complaint
// about a missing driver (cudaErrorInsufficientDriver where a CUDA build
// meets no driver), which would be noise in every CPU job's log.
TEST(WorkerDeviceFlagTest, ACpuWorkerWithoutAnNvidiaDeviceLogsNoCudaError) {
  if (std::filesystem::exists("/dev/nvidiactl")) {
    GTEST_SKIP() << "this host has an NVIDIA device, where the reason is worth a line";
  }
  const std::string log_path = absl::StrCat(::testing::TempDir(), "/device_test.", getpid(), ".log");
  for (const char* device : {"cpu", "auto"}) {
    SCOPED_TRACE(device);
    // No PS answers: the worker logs its devices, then gives up after 1 s (exit 2).
    const std::string line =
        absl::StrCat("timeout -k 5 60 ", PST_BIN_DIR, "/worker --task=worker:0 --device=", device,
                     " --connect_timeout_seconds=1 >", log_path, " 2>&1 </dev/null");
    const int status = std::system(line.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
    std::ifstream in(log_path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_THAT(text.str(), HasSubstr("worker:0 computing on 1 tower(s): cpu"));
    EXPECT_THAT(text.str(), Not(HasSubstr("cudaGetDeviceCount")));
    EXPECT_THAT(text.str(), Not(HasSubstr("cudaError")));
  }
  std::filesystem::remove(log_path);
}

TEST(GpuBenchTest, WithoutAGpuExitsWithCode2AndOneLine) {
#ifndef PST_HAS_GPU_BENCH
  GTEST_SKIP() << "gpu_bench is built only with CUDA";
#endif
  // The inverse of the GPU tests: this one needs the GPU to be absent, but a
  // GPU the runtime cannot see still fails here rather than passing.
  const GpuTestDecision gpu = DecideGpuTest(ObserveGpuFacts());
  if (gpu.verdict == GpuTestVerdict::kRun) {
    GTEST_SKIP() << "a GPU is visible: gpu_bench would run in full";
  }
  if (gpu.verdict == GpuTestVerdict::kFail) FAIL() << gpu.reason;
  CommandResult r = RunBinary("gpu_bench", "");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("gpu_bench: error: needs a GPU"));
  std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 1u) << r.err;
}

}  // namespace PST_FILE_ID
}  // namespace pst
