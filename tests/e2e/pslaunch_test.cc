// The shipped binaries as a user runs them: pslaunch starting real ps_server
// and worker processes on loopback, and the one-line errors of each binary.
// Every command runs under `timeout`, and pslaunch reaps its own children.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"
#include "result.pb.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

std::string WriteConfig(const std::string& name, const std::string& text) {
  std::string path = ScratchDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string FashionMnistConfig(int port) {
  return absl::StrCat(R"(
cluster { ps: "127.0.0.1:)", port, R"(" workers: 2 }
training {
  optimizer { adam { learning_rate: 0.0005 } }  # one epoch: a calmer final iterate
  batch_size: 64
  epochs: 1
  model { mlp { hidden: 256 hidden: 128 } }
  dataset { fashion_mnist {} }
})");
}

std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

class PslaunchTrainingTest : public ::testing::TestWithParam<std::string> {};

// 1 PS + 2 worker processes, one epoch of Fashion-MNIST: the summary line is
// the last stdout line and the model is good.
TEST_P(PslaunchTrainingTest, OneEpochOfFashionMnistReachesEightyPercent) {
  std::string config = WriteConfig("fmnist.textproto", FashionMnistConfig(FreePort()));
  CommandResult run = RunCommand(
      absl::StrCat(Bin("pslaunch"), " --config=", config, " --mode=", GetParam()), 400);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("[worker:1]"));
  EXPECT_THAT(run.out, HasSubstr("[ps:0]"));
  std::string summary_line = LastLine(run.out);
  EXPECT_EQ(summary_line.rfind("{\"mode\":", 0), 0u) << summary_line;
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(summary_line, &summary).ok())
      << summary_line;
  EXPECT_EQ(summary.mode(), GetParam());
  EXPECT_EQ(summary.workers(), 2);
  EXPECT_EQ(summary.epochs(), 1);
  EXPECT_GT(summary.steps(), 0);
  EXPECT_GE(summary.test_accuracy(), 0.80);
  EXPECT_GT(summary.train_samples_per_sec(), 0);
}

INSTANTIATE_TEST_SUITE_P(BothModes, PslaunchTrainingTest, ::testing::Values("sync", "async"));

// Two PS shards as two processes: the big first kernel is sliced across
// both, and SYNC still trains the same model.
TEST(PslaunchShardsTest, TwoShardsTrainFashionMnist) {
  std::string text = FashionMnistConfig(FreePort());
  text.replace(text.find(" workers: 2"), 0, absl::StrCat(" ps: \"127.0.0.1:", FreePort(), "\""));
  std::string config = WriteConfig("two_shards.textproto", text);
  CommandResult run = RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", config), 400);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("[ps:1]"));
  EXPECT_THAT(run.out, HasSubstr("2 shard(s)"));
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(LastLine(run.out), &summary).ok());
  EXPECT_GE(summary.test_accuracy(), 0.80);
}

// PIDs of this user's processes whose command line contains both strings.
std::vector<pid_t> FindProcesses(const std::string& binary, const std::string& marker) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = atoi(entry.path().filename().c_str());
    if (pid <= 0) continue;
    std::string cmdline = ReadFile(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(binary) != std::string::npos && cmdline.find(marker) != std::string::npos) {
      pids.push_back(pid);
    }
  }
  return pids;
}

class PslaunchRestartTest : public ::testing::TestWithParam<std::string> {};

// pslaunch's restart policy: the task named by the parameter is killed with
// SIGKILL mid-run; pslaunch restarts it (the PS from its checkpoint, the
// worker resuming its steps) and the run still finishes with a good model.
TEST_P(PslaunchRestartTest, AKilledTaskIsRestartedAndTheRunFinishes) {
  const std::string victim = GetParam();  // "ps_server" or "worker"
  const std::string dir = ScratchDir() + "/restart_" + victim;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string config = WriteConfig(
      "restart.textproto",
      absl::StrCat("cluster { ps: \"127.0.0.1:", FreePort(), "\" workers: 2 max_restarts: 2 }\n",
                   "training { optimizer { adam { learning_rate: 0.001 } } batch_size: 32 epochs: 2\n",
                   "  lease_seconds: 1 model { mlp { hidden: 64 } }\n",
                   "  dataset { fashion_mnist { train_limit: 20000 } }\n",
                   "  checkpoint { dir: \"", dir, "/ckpt\" every_steps: 50 } }\n"));
  const std::string out = dir + "/out", err = dir + "/err";
  pid_t launcher = fork();
  if (launcher == 0) {
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    execl("/usr/bin/timeout", "timeout", "-k", "5", "300", Bin("pslaunch").c_str(),
          ("--config=" + config).c_str(), ("--result_dir=" + dir + "/run").c_str(), nullptr);
    _exit(127);
  }
  // Wait for training to be under way, then kill the victim.
  const std::string marker = dir + "/run/cluster.textproto";
  bool killed = false;
  for (absl::Time deadline = absl::Now() + absl::Seconds(60); absl::Now() < deadline && !killed;
       absl::SleepFor(absl::Milliseconds(100))) {
    if (ReadFile(out).find("step 200/") == std::string::npos) continue;
    std::vector<pid_t> pids = FindProcesses(Bin(victim) + " ", marker);
    if (pids.empty()) continue;
    kill(pids.back(), SIGKILL);
    killed = true;
  }
  int status = 0;
  waitpid(launcher, &status, 0);
  ASSERT_TRUE(killed) << ReadFile(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(err);
  EXPECT_THAT(ReadFile(err), HasSubstr("restarting it (1 of 2)"));
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(LastLine(ReadFile(out)), &summary).ok())
      << ReadFile(out);
  EXPECT_GE(summary.test_accuracy(), 0.78);
}

INSTANTIATE_TEST_SUITE_P(PsOrWorker, PslaunchRestartTest, ::testing::Values("ps_server", "worker"));

// psctl against a live cluster: status shows every shard and worker,
// checkpoint writes one, shutdown stops the cluster and pslaunch exits 0.
TEST(PsctlTest, StatusCheckpointAndShutdownOfALiveCluster) {
  const std::string dir = ScratchDir() + "/psctl";
  std::filesystem::remove_all(dir);
  std::string config = WriteConfig(
      "psctl.textproto",
      absl::StrCat("cluster { ps: \"127.0.0.1:", FreePort(), "\" workers: 2 }\n",
                   "training { optimizer { sgd { learning_rate: 0.05 } } batch_size: 16 epochs: 50\n",
                   "  model { mlp { hidden: 32 } } dataset { fashion_mnist { train_limit: 20000 } }\n",
                   "  checkpoint { dir: \"", dir, "/ckpt\" } }\n"));
  pid_t launcher = fork();
  if (launcher == 0) {
    freopen((dir + ".out").c_str(), "w", stdout);
    freopen((dir + ".err").c_str(), "w", stderr);
    execl("/usr/bin/timeout", "timeout", "-k", "5", "120", Bin("pslaunch").c_str(),
          ("--config=" + config).c_str(), nullptr);
    _exit(127);
  }
  for (absl::Time deadline = absl::Now() + absl::Seconds(60);
       absl::Now() < deadline && ReadFile(dir + ".out").find("step 100/") == std::string::npos;
       absl::SleepFor(absl::Milliseconds(100))) {
  }
  CommandResult status = RunCommand(absl::StrCat(Bin("psctl"), " status --config=", config), 30);
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("ps:0"));
  EXPECT_THAT(status.out, HasSubstr("worker:1"));
  EXPECT_THAT(status.out, HasSubstr("live"));
  CommandResult checkpoint = RunCommand(absl::StrCat(Bin("psctl"), " checkpoint --config=", config), 30);
  EXPECT_EQ(checkpoint.exit_code, 0) << checkpoint.err;
  EXPECT_THAT(checkpoint.out, HasSubstr(dir + "/ckpt/shard-0/ckpt-"));
  CommandResult shutdown = RunCommand(absl::StrCat(Bin("psctl"), " shutdown --config=", config), 30);
  EXPECT_EQ(shutdown.exit_code, 0) << shutdown.err;
  int code = 0;
  waitpid(launcher, &code, 0);
  EXPECT_TRUE(WIFEXITED(code) && WEXITSTATUS(code) == 0) << ReadFile(dir + ".err");
  EXPECT_THAT(ReadFile(dir + ".err"), HasSubstr("was shut down"));
}

// Each mistake a user can make on the command line: exit code 2 and one
// line naming what and where.
TEST(BinaryErrorsTest, UserMistakesGiveOneLineAndExitCodeTwo) {
  std::string malformed = WriteConfig("malformed.textproto", "cluster {\n  workers: two\n}\n");
  std::string no_data = WriteConfig(
      "no_data.textproto",
      absl::StrCat(R"(cluster { ps: "127.0.0.1:)", FreePort(), R"(" workers: 1 }
training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} }
  dataset { fashion_mnist { dir: "/nonexistent/fmnist" } } })"));
  std::string unreachable = WriteConfig("unreachable.textproto", FashionMnistConfig(FreePort()));
  struct Case {
    std::string name;
    std::string command;
    std::string message;
  };
  std::vector<Case> cases = {
      {"malformed config (pslaunch)", Bin("pslaunch") + " --config=" + malformed,
       "malformed.textproto:2:"},
      {"malformed config (ps_server)", Bin("ps_server") + " --config=" + malformed,
       "malformed.textproto:2:"},
      {"missing config file", Bin("worker") + " --config=/nonexistent.textproto",
       "cannot read config file /nonexistent.textproto"},
      {"bad mode flag", Bin("ps_server") + " --mode=eventually", "unknown mode \"eventually\""},
      {"task outside the cluster", Bin("ps_server") + " --config=" + unreachable + " --task=ps:3",
       "task ps:3 does not exist"},
      {"missing data set", Bin("worker") + " --config=" + no_data + " --task=worker:0",
       "/nonexistent/fmnist"},
      {"unreachable PS",
       Bin("worker") + " --config=" + unreachable + " --task=worker:1 --connect_timeout_seconds=1",
       "cannot reach ps:0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CommandResult run = RunCommand(c.command, 60);
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_THAT(run.err, HasSubstr(c.message));
    EXPECT_THAT(run.err, HasSubstr("error: "));
    std::vector<std::string> lines = absl::StrSplit(run.err, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), 1u) << run.err;
  }
}

}  // namespace
}  // namespace pst
