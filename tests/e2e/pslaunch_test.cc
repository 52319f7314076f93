// The shipped binaries as a user runs them: pslaunch starting real ps_server
// and worker processes on loopback, and the one-line errors of each binary.
// Every command runs under `timeout`, and pslaunch reaps its own children.
// The PS addresses have port 0: each PS binds a port the system picks, and
// pslaunch gives the workers the ports they got.
#include <netinet/in.h>
#include <sys/prctl.h>
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
#include "tests/support/eventually.h"
#include "result.pb.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

std::string WriteConfig(const std::string& name, const std::string& text) {
  std::string path = ScratchDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string FashionMnistConfig(const std::string& ps = "127.0.0.1:0") {
  return absl::StrCat(R"(
cluster { ps: ")", ps, R"(" workers: 2 }
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
  std::string config = WriteConfig("fmnist.textproto", FashionMnistConfig());
  CommandResult run = RunCommand(
      absl::StrCat(Bin("pslaunch"), " --config=", config, " --mode=", GetParam()), 400);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("[worker:1]"));
  EXPECT_THAT(run.out, HasSubstr("[ps:0]"));
  EXPECT_THAT(run.err, HasSubstr("PS tasks bound the ports they got: ps:0=127.0.0.1:"));
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
  std::string text = FashionMnistConfig();
  text.replace(text.find(" workers: 2"), 0, " ps: \"127.0.0.1:0\"");
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
      absl::StrCat("cluster { ps: \"127.0.0.1:0\" workers: 2 max_restarts: 2 }\n",
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
  const bool killed = Eventually(
      [&] {
        if (ReadFile(out).find("step 200/") == std::string::npos) return false;
        std::vector<pid_t> pids = FindProcesses(Bin(victim) + " ", marker);
        if (pids.empty()) return false;
        kill(pids.back(), SIGKILL);
        return true;
      },
      absl::Seconds(60), absl::Milliseconds(100));
  int status = 0;
  waitpid(launcher, &status, 0);
  ASSERT_TRUE(killed) << ReadFile(err);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(err);
  EXPECT_THAT(ReadFile(err), HasSubstr("restarting it (1 of 2)"));
  // The workers reconnect to a restarted PS where it was: it binds the port
  // it got the first time again.
  const std::string log = ReadFile(err), bound = "PS tasks bound the ports they got: ps:0=";
  const size_t at = log.find(bound);
  ASSERT_NE(at, std::string::npos) << log;
  const size_t from = at + bound.size();
  const std::string serving = "ps:0 serving " + log.substr(from, log.find('\n', from) - from) + " (";
  const std::string output = ReadFile(out) + log;
  size_t servings = 0;
  for (size_t i = output.find(serving); i != std::string::npos; i = output.find(serving, i + 1)) {
    ++servings;
  }
  EXPECT_EQ(servings, victim == "ps_server" ? 2u : 1u) << serving << " in:\n" << output;
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(LastLine(ReadFile(out)), &summary).ok())
      << ReadFile(out);
  EXPECT_GE(summary.test_accuracy(), 0.78);
}

INSTANTIATE_TEST_SUITE_P(PsOrWorker, PslaunchRestartTest, ::testing::Values("ps_server", "worker"));

// psctl against a live cluster: status shows every shard and worker,
// checkpoint writes one, shutdown stops the cluster and pslaunch exits 0.
// The PS got its port from the system: psctl reads it from the effective
// config pslaunch keeps in --result_dir.
TEST(PsctlTest, StatusCheckpointAndShutdownOfALiveCluster) {
  const std::string dir = ScratchDir() + "/psctl";
  std::filesystem::remove_all(dir);
  const std::string launched = WriteConfig(
      "psctl.textproto",
      absl::StrCat("cluster { ps: \"127.0.0.1:0\" workers: 2 }\n",
                   "training { optimizer { sgd { learning_rate: 0.05 } } batch_size: 16 epochs: 50\n",
                   "  model { mlp { hidden: 32 } } dataset { fashion_mnist { train_limit: 20000 } }\n",
                   "  checkpoint { dir: \"", dir, "/ckpt\" } }\n"));
  pid_t launcher = fork();
  if (launcher == 0) {
    freopen((dir + ".out").c_str(), "w", stdout);
    freopen((dir + ".err").c_str(), "w", stderr);
    execl("/usr/bin/timeout", "timeout", "-k", "5", "120", Bin("pslaunch").c_str(),
          ("--config=" + launched).c_str(), ("--result_dir=" + dir + "/run").c_str(), nullptr);
    _exit(127);
  }
  const std::string config = dir + "/run/cluster.textproto";
  // Failing here still goes on to the shutdown below, which ends the cluster.
  EXPECT_TRUE(Eventually(
      [&] { return ReadFile(dir + ".out").find("step 100/") != std::string::npos; },
      absl::Seconds(60), absl::Milliseconds(100)))
      << ReadFile(dir + ".err");
  CommandResult status = RunCommand(absl::StrCat(Bin("psctl"), " status --config=", config), 30);
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("ps:0"));
  EXPECT_THAT(status.out, HasSubstr("worker:1"));
  EXPECT_THAT(status.out, HasSubstr("live"));
  EXPECT_THAT(status.out, ::testing::ContainsRegex("region_handoffs\nps:0( +[0-9]+){4}\n"));
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
  // The workers take no port 0, and these configs are theirs too: port 1,
  // where nothing listens.
  std::string no_data = WriteConfig(
      "no_data.textproto",
      R"(cluster { ps: "127.0.0.1:1" workers: 1 }
training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} }
  dataset { fashion_mnist { dir: "/nonexistent/fmnist" } } })");
  std::string unreachable = WriteConfig("unreachable.textproto", FashionMnistConfig("127.0.0.1:1"));
  std::string port_zero = WriteConfig("port_zero.textproto", FashionMnistConfig());
  const std::string good = FashionMnistConfig("127.0.0.1:1");
  auto variant = [&good](const std::string& name, const std::string& from, const std::string& to) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    return WriteConfig(name, text);
  };
  std::string empty_token = WriteConfig("empty.token", "");
  const std::string good_path = WriteConfig("good.textproto", good);
  std::string many_workers = variant("many.textproto", "workers: 2", "workers: 300");
  std::string huge_cluster = variant("huge.textproto", "workers: 2", "workers: 100000");
  std::string duplicate_ps = variant("duplicate.textproto", " workers: 2",
                                     " ps: \"127.0.0.1:2\" ps: \"127.0.0.1:2\" workers: 2");
  std::string mode_seven = variant("mode7.textproto", "batch_size: 64", "batch_size: 64 mode: 7");
  std::string every_minus = variant("every.textproto", "epochs: 1",
                                    "epochs: 1 checkpoint { dir: \"c\" every_steps: -5 }");
  std::string keep_minus =
      variant("keep.textproto", "epochs: 1", "epochs: 1 checkpoint { dir: \"c\" keep: -2 }");
  std::string unwritable = variant("unwritable.textproto", "epochs: 1",
                                   "epochs: 1 checkpoint { dir: \"/etc/passwd/ckpt\" }");
  std::string token = variant(
      "token.textproto", " workers: 2 }",
      absl::StrCat(" workers: 2 tls { ca: \"/etc/ssl/certs/ca-certificates.crt\" }"
                   " auth { token_file: \"", empty_token, "\" } }"));
  std::string huge_model =
      variant("huge_model.textproto", "hidden: 256 hidden: 128", "hidden: 100000 hidden: 100000");
  std::string no_brace = variant("brace.textproto", " workers: 2 }", " workers: 2");
  std::string deep_json = WriteConfig(
      "deep.json", "{\"cluster\": {\"ps\": " + std::string(100000, '[') + std::string(100000, ']') + "}}");
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
      {"more tasks than one host runs", Bin("pslaunch") + " --config=" + many_workers,
       "= 301 tasks, more than the"},
      {"more tasks than one host runs (check)",
       Bin("pslaunch") + " --check_config --config=" + many_workers, "(--max_local_tasks)"},
      {"absurd cluster", Bin("ps_server") + " --check_config --config=" + huge_cluster,
       "cluster.workers 100000 is more than the 4096"},
      {"duplicate PS addresses", Bin("ps_server") + " --task=ps:1 --config=" + duplicate_ps,
       "is also cluster.ps[1]; every shard needs its own address"},
      {"mode out of range", Bin("ps_server") + " --check_config --config=" + mode_seven,
       "training.mode 7 is not a mode"},
      {"negative every_steps", Bin("ps_server") + " --check_config --config=" + every_minus,
       "training.checkpoint.every_steps is -5"},
      {"negative keep", Bin("pslaunch") + " --check_config --config=" + keep_minus,
       "training.checkpoint.keep is -2"},
      {"unwritable checkpoint directory", Bin("ps_server") + " --check_config --config=" + unwritable,
       "/etc/passwd is not a directory"},
      {"empty token file", Bin("worker") + " --check_config --config=" + token, "is empty"},
      {"model too large", Bin("worker") + " --config=" + huge_model,
       "makes a model of 10079600010 parameters"},
      {"directory as config", Bin("ps_server") + " --config=" + ScratchDir(), "is a directory"},
      {"endless config", Bin("ps_server") + " --config=/dev/zero", "larger than 16 MiB"},
      {"unknown flag", Bin("pslaunch") + " --epocks=3", "unknown flag --epocks"},
      {"malformed flag value", Bin("worker") + " --epochs=three", "--epochs=three"},
      {"missing closing brace", Bin("pslaunch") + " --check_config --config=" + no_brace,
       "is a closing } missing before it?"},
      {"unknown shm setting", Bin("ps_server") + " --check_config --shm=maybe --config=" + good_path,
       "--shm: unknown setting \"maybe\"; use auto or off"},
      {"JSON nested past any config", Bin("ps_server") + " --check_config --config=" + deep_json,
       "nested more than 32 levels deep"},
      {"worker given port 0", Bin("worker") + " --config=" + port_zero + " --task=worker:0",
       "cluster.ps[0] \"127.0.0.1:0\" is not \"host:port\""},
      {"port file where nothing can be written",
       Bin("ps_server") + " --config=" + port_zero + " --port_file=/nonexistent/ps.port",
       "--port_file=/nonexistent/ps.port: /nonexistent is not a folder this user can write to"},
      {"port file that is a folder (check)",
       Bin("ps_server") + " --check_config --config=" + port_zero + " --port_file=" + ScratchDir(),
       "is a directory; name a file in it"},
      {"no time to report ports",
       Bin("pslaunch") + " --config=" + port_zero + " --port_timeout_seconds=0",
       "--port_timeout_seconds=0 must be a positive number of seconds"},
      {"report where nothing can be written",
       Bin("pslaunch") + " --report=/nonexistent/run.html --config=" + good_path,
       "--report=/nonexistent/run.html: /nonexistent is not a folder this user can write to"},
  };
  // A PS unreachable for the whole connect timeout: the worker says it
  // waits, at once and every few seconds, then exits 2 naming the shard and
  // its address (README, "Errors"): a restart would wait as long again.
  {
    CommandResult run = RunCommand(
        Bin("worker") + " --config=" + unreachable + " --task=worker:1 --connect_timeout_seconds=1",
        60);
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_THAT(run.err + run.out, HasSubstr("waiting for ps:0 at "));
    EXPECT_THAT(run.err, HasSubstr("cannot reach ps:0"));
  }
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

// ps_server on port 0 with --port_file: once serving it writes the port it
// got (whole, no temporary file left) and logs the address it is bound to;
// a client given that port connects, and the PS stops on SIGTERM.
TEST(PsServerPortFileTest, PortZeroWritesThePortFileAClientConnectsTo) {
  const std::string dir = ScratchDir() + "/port_file";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string config = WriteConfig(
      "port_file.textproto",
      "cluster { ps: \"127.0.0.1:0\" workers: 1 }\n"
      "training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} }\n"
      "  dataset { quadratic { examples: 256 } } }\n");
  const std::string port_file = dir + "/ps.port", log = dir + "/ps.log";
  // Not under timeout(1), which would pass the SIGTERM below on twice (to
  // the PS and to its group): it dies with this test, and is killed below.
  pid_t ps = fork();
  if (ps == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    freopen(log.c_str(), "w", stdout);
    dup2(fileno(stdout), fileno(stderr));
    execl(Bin("ps_server").c_str(), "ps_server", ("--config=" + config).c_str(),
          ("--port_file=" + port_file).c_str(), nullptr);
    _exit(127);
  }
  const int port = AwaitPortFile(port_file, ps);
  if (port == 0) {
    kill(ps, SIGKILL);
    waitpid(ps, nullptr, 0);
    FAIL() << "no port file; the PS said:\n" << ReadFile(log);
  }
  EXPECT_EQ(ReadFile(port_file), absl::StrCat(port, "\n"));
  EXPECT_FALSE(std::filesystem::exists(port_file + ".tmp"));
  EXPECT_THAT(ReadFile(log), HasSubstr(absl::StrCat("ps:0 serving 127.0.0.1:", port, " (")));

  const std::string client_config = WriteConfig(
      "port_file_client.textproto",
      absl::StrCat("cluster { ps: \"127.0.0.1:", port, "\" workers: 1 }\n",
                   "training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} }\n",
                   "  dataset { quadratic { examples: 256 } } }\n"));
  CommandResult status =
      RunCommand(absl::StrCat(Bin("psctl"), " status --config=", client_config), 30);
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr(absl::StrCat("127.0.0.1:", port)));

  kill(ps, SIGTERM);
  EXPECT_TRUE(AwaitProcessEnd(ps, absl::Seconds(30))) << ReadFile(log);
  kill(ps, SIGKILL);  // still ours: not reaped yet
  int code = 0;
  waitpid(ps, &code, 0);
  EXPECT_TRUE(WIFEXITED(code) && WEXITSTATUS(code) == 0) << ReadFile(log);
}

// A PS with port 0 that exits before it reports its port, or never reports
// it: pslaunch starts no worker, stops the PS, and ends with one line and
// the PS's exit code, or 1 after --port_timeout_seconds. The tasks are
// stand-ins that bind nothing.
TEST(PslaunchPortTest, APsThatReportsNoPortEndsTheRunBeforeAnyWorkerStarts) {
  struct Case {
    std::string name;
    std::string ps_script;
    int exit_code;
    std::string last_line;
  };
  const std::vector<Case> cases = {
      {"exits", "#!/bin/sh\necho 'ps_server: error: cannot start' >&2\nexit 3\n", 3,
       "pslaunch: task ps:0 exited with code 3 before it reported the port it got (its output is "
       "above); stopped the other tasks"},
      {"silent", "#!/bin/sh\nexec sleep 60\n", 1,
       "pslaunch: error: ps:0 did not report the port it got within 1 s; stopped every task: see "
       "its output above, or raise --port_timeout_seconds"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string bin = ScratchDir() + "/no_port_bin_" + c.name;
    std::filesystem::remove_all(bin);
    std::filesystem::create_directories(bin);
    std::ofstream(bin + "/ps_server") << c.ps_script;
    std::ofstream(bin + "/worker") << "#!/bin/sh\ntouch \"$(dirname \"$0\")/started\"\n";
    for (const char* name : {"/ps_server", "/worker"}) {
      std::filesystem::permissions(bin + name, std::filesystem::perms::owner_all);
    }
    const std::string config = WriteConfig(
        "no_port.textproto",
        "cluster { ps: \"127.0.0.1:0\" workers: 1 }\n"
        "training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} }\n"
        "  dataset { quadratic { examples: 256 } } }\n");
    CommandResult run = RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", config,
                                                " --bin_dir=", bin,
                                                " --port_timeout_seconds=1 --grace_seconds=1"),
                                   60);
    EXPECT_EQ(run.exit_code, c.exit_code) << run.err;
    EXPECT_THAT(LastLine(run.err), HasSubstr(c.last_line)) << run.err;
    EXPECT_FALSE(std::filesystem::exists(bin + "/started")) << "a worker started";
  }
}

std::string TinyCheckpointedConfig(const std::string& checkpoints) {
  return absl::StrCat("cluster { ps: \"127.0.0.1:0\" workers: 2 }\n",
                      "training { optimizer { sgd { learning_rate: 0.05 } } batch_size: 8\n",
                      "  model { mlp { hidden: 8 } } dataset { quadratic { examples: 256 } }\n",
                      "  checkpoint { dir: \"", checkpoints, "\" every_steps: 4 } }\n");
}

// Each pslaunch is a run of its own: a second launch in a finished run's
// checkpoint directory does not "finish" at once on the old state; asked to
// restore it, the chief refuses to call a run without training a success;
// asked to start fresh, it trains.
TEST(PslaunchCheckpointTest, ANewLaunchDoesNotTakeOverAFinishedRun) {
  const std::string dir = ScratchDir() + "/new_launch";
  std::filesystem::remove_all(dir);
  const std::string config =
      WriteConfig("new_launch.textproto", TinyCheckpointedConfig(dir + "/ckpt"));
  const std::string launch = absl::StrCat(Bin("pslaunch"), " --config=", config);
  CommandResult first = RunCommand(launch, 120);
  ASSERT_EQ(first.exit_code, 0) << first.err;

  CommandResult second = RunCommand(launch, 120);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_THAT(second.err, HasSubstr("[ps:0] ps_server: error: ps:0: " + dir +
                                    "/ckpt/shard-0 holds the checkpoints of another run"));
  EXPECT_THAT(LastLine(second.err), HasSubstr("pslaunch: task ps:0 exited with code 2 before it "
                                              "reported the port it got"));
  EXPECT_THAT(second.out, ::testing::Not(HasSubstr("{\"mode\":")));

  CommandResult restored = RunCommand(launch + " --checkpoint_start=restore", 120);
  EXPECT_EQ(restored.exit_code, 2) << restored.err;
  EXPECT_THAT(restored.err, HasSubstr("no training happened"));

  CommandResult fresh = RunCommand(launch + " --checkpoint_start=fresh", 120);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(LastLine(fresh.out), &summary).ok());
  EXPECT_EQ(summary.steps(), 16);
}

// SIGTERM while pslaunch is still starting tasks: it starts no more and is
// gone within --grace_seconds, even though its tasks ignore SIGTERM. The
// tasks here are stand-ins: the PS sends pslaunch SIGTERM as it starts.
TEST(PslaunchSignalTest, SigtermWhileStartingTasksStopsWithinTheGracePeriod) {
  const std::string bin = ScratchDir() + "/fake_bin";
  std::filesystem::remove_all(bin);
  std::filesystem::create_directories(bin);
  std::ofstream(bin + "/ps_server") << "#!/bin/sh\ntrap '' TERM\nkill -TERM $PPID\nexec sleep 300\n";
  std::ofstream(bin + "/worker") << "#!/bin/sh\ntrap '' TERM\necho started >> \"$(dirname \"$0\")/started\"\n"
                                 << "exec sleep 300\n";
  for (const char* name : {"/ps_server", "/worker"}) {
    std::filesystem::permissions(bin + name, std::filesystem::perms::owner_all);
  }
  // An explicit port (the stand-in PS binds nothing): pslaunch starts the
  // workers without waiting for a port.
  std::string config = WriteConfig(
      "many_fakes.textproto",
      "cluster { ps: \"127.0.0.1:1\" workers: 200 }\n"
      "training { optimizer { sgd { learning_rate: 0.1 } } model { mlp {} }\n"
      "  dataset { quadratic { examples: 256 } } }\n");
  const absl::Time start = absl::Now();
  CommandResult run = RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", config, " --bin_dir=",
                                              bin, " --max_local_tasks=300 --grace_seconds=1"),
                                 60);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(run.exit_code, 130) << run.err;
  EXPECT_THAT(run.err, HasSubstr("interrupted; stopped every task"));
  const std::string started = ReadFile(bin + "/started");
  const size_t workers_started = std::count(started.begin(), started.end(), '\n');
  EXPECT_LT(workers_started, 100u) << "pslaunch went on starting tasks after SIGTERM";
  EXPECT_LT(took, absl::Seconds(10));
}

}  // namespace PST_FILE_ID
}  // namespace pst
