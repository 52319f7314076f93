// Fault injection with real processes on loopback: a worker killed with
// SIGKILL mid-run (and restarted, or gone for good), the PS killed with
// SIGKILL mid-run and restarted from its checkpoint, checkpoints that do not
// restore or belong to a finished run, and a disk that refuses checkpoints.
// Every process is started here, watched by PID, and killed at the end
// whatever happens. The PS binds port 0 and reports the port it got
// (--port_file); the configs then name that port, and a restarted PS binds
// it again.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/shared_memory.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "result.pb.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    // Per process: two runs of this suite (two checkouts, or ctest beside
    // a developer) must not share config files or checkpoints.
    dir_ = absl::StrCat(ScratchDir(), "/fault_", name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  std::string WriteConfig(int workers, const std::string& extra, int pull_timeout_seconds = 60,
                          int epochs = 2) {
    return Remember(dir_ + "/job.textproto",
                    absl::StrCat("  workers: ", workers, " }\n",
                                 "training {\n  optimizer { adam { learning_rate: 0.001 } }\n",
                                 "  batch_size: 32 epochs: ", epochs, " lease_seconds: 1\n",
                                 "  pull_timeout_seconds: ", pull_timeout_seconds, "\n",
                                 "  model { mlp { hidden: 64 } }\n",
                                 "  dataset { fashion_mnist { train_limit: 12000 } }\n", extra,
                                 "}\n"));
  }

  // One worker, sixteen steps: a whole run in about a second.
  std::string WriteTinyConfig(const std::string& extra) {
    return Remember(
        dir_ + "/tiny.textproto",
        absl::StrCat("  workers: 1 }\n",
                     "training { optimizer { sgd { learning_rate: 0.05 } } batch_size: 16\n",
                     "  model { mlp { hidden: 8 } } dataset { quadratic { examples: 256 } }\n",
                     extra, "}\n"));
  }

  // Writes the config at `path`, "cluster { ps: ADDRESS" followed by
  // `rest`, with the PS's address: port 0 until the PS has reported the
  // port it got, then that port (StartPs writes every config again).
  std::string Remember(const std::string& path, const std::string& rest) {
    configs_[path] = rest;
    std::ofstream(path) << "cluster { ps: \"" << (address_.empty() ? "127.0.0.1:0" : address_)
                        << "\"\n" << rest;
    return path;
  }

  // The first PS binds port 0 and reports the port it got, which the
  // configs then name, for the workers and for every later PS, which binds
  // it again. No port is reported by a PS that exits before serving.
  std::unique_ptr<ChildProcess> StartPs(const std::string& config,
                                   const std::vector<std::string>& prefix = {},
                                   const std::string& extra_arg = "",
                                   const std::string& log = "ps.log") {
    std::vector<std::string> argv = prefix;
    for (const std::string& arg : {Bin("ps_server"), "--config=" + config, std::string("--task=ps:0")}) {
      argv.push_back(arg);
    }
    if (!extra_arg.empty()) argv.push_back(extra_arg);
    const std::string port_file = dir_ + "/ps.port";
    if (address_.empty()) argv.push_back("--port_file=" + port_file);
    auto ps = std::make_unique<ChildProcess>(argv, dir_ + "/" + log);
    if (address_.empty()) {
      if (const int port = AwaitPortFile(port_file, ps->pid()); port > 0) {
        address_ = absl::StrCat("127.0.0.1:", port);
        for (const auto& [path, rest] : std::map(configs_)) Remember(path, rest);
      }
    }
    return ps;
  }
  std::unique_ptr<ChildProcess> StartWorker(const std::string& config, int rank) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{Bin("worker"), "--config=" + config,
                                 absl::StrCat("--task=worker:", rank),
                                 absl::StrCat("--result_file=", dir_, "/worker-", rank, ".json")},
        absl::StrCat(dir_, "/worker-", rank, ".log"));
  }

  absl::StatusOr<StatsResponse> TryStats(absl::Duration connect_timeout) {
    if (address_.empty()) {
      return absl::FailedPreconditionError("no PS has reported the port it got; see ps.log");
    }
    auto client = PsClient::Connect({address_}, 0, connect_timeout);
    if (!client.ok()) return client.status();
    return (*client)->Stats(0);
  }

  StatsResponse Stats() {
    absl::StatusOr<StatsResponse> stats = TryStats(absl::Seconds(10));
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : StatsResponse();
  }

  // Waits until the shard's version reaches `version`; returns the last
  // version seen (below `version` if the wait ran out).
  int64_t WaitForVersion(int64_t version, absl::Duration timeout) {
    int64_t seen = -1;
    Eventually([&] { return (seen = Stats().version()) >= version; }, timeout,
               absl::Milliseconds(100));
    return seen;
  }

  WorkerResult Result(int rank) {
    std::ifstream in(absl::StrCat(dir_, "/worker-", rank, ".json"));
    std::stringstream text;
    text << in.rdbuf();
    WorkerResult result;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &result).ok());
    return result;
  }

  // The lines of a log that contain "error: ".
  std::vector<std::string> ErrorLines(const std::string& name) {
    std::vector<std::string> errors;
    std::stringstream log(Log(name));
    for (std::string line; std::getline(log, line);) {
      if (line.find("error: ") != std::string::npos) errors.push_back(line);
    }
    return errors;
  }

  std::vector<std::string> FilesUnder(const std::string& path) {
    std::vector<std::string> files;
    std::error_code error;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path, error)) {
      if (entry.is_regular_file()) files.push_back(entry.path().filename().string());
    }
    return files;
  }

  // The shared-memory objects a process with this pid created that are
  // still in /dev/shm.
  static std::vector<std::string> SharedRegionsOf(pid_t pid) {
    const std::string prefix = SharedRegionPrefix(pid).substr(1);  // no leading '/'
    std::vector<std::string> left;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(prefix, 0) == 0) left.push_back(name);
    }
    return left;
  }

  static int Count(const std::string& text, const std::string& what) {
    int count = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
      ++count;
    }
    return count;
  }

  std::string Log(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::string dir_;
  std::string address_;  // the PS's, once it has reported the port it got
  std::map<std::string, std::string> configs_;  // path -> what follows the PS address
};

class WorkerFaultTest : public FaultTest, public ::testing::WithParamInterface<std::string> {};

// Three workers; worker:2 is killed with SIGKILL mid-run. The other two keep
// stepping within the lease (in SYNC no step waits for the dead worker, in
// SSP its frozen clock does not hold the others); worker:2 restarted
// re-registers, resumes after the steps it had done, and the run completes.
TEST_P(WorkerFaultTest, SurvivesAKilledWorkerThatIsRestarted) {
  // Six epochs (750 steps a worker): the others are still training when
  // worker:2, which may start a second after them, is killed.
  std::string config = WriteConfig(3, absl::StrCat("  mode: ", GetParam(), " staleness: 2\n"),
                                   /*pull_timeout_seconds=*/60, /*epochs=*/6);
  auto ps = StartPs(config);
  auto w0 = StartWorker(config, 0), w1 = StartWorker(config, 1);
  auto w2 = StartWorker(config, 2);
  ASSERT_GE(WaitForVersion(40, absl::Seconds(60)), 40) << Log("ps.log");
  // On a loaded machine the others can reach version 40 in ASYNC before
  // worker:2 has started; it must have pushed before it is killed mid-run.
  ASSERT_TRUE(Eventually([&] { return Stats().workers(2).clock() > 0; }, absl::Seconds(60),
                         absl::Milliseconds(20)))
      << Log("worker-2.log");
  // Its tensors went through shared memory with the PS; killed mid-write,
  // it leaves no segment behind (a sealed region has no name, a named one
  // is unlinked once the PS has opened it).
  EXPECT_THAT(Log("worker-2.log"), ::testing::HasSubstr("tensors travel through shared memory"));
  const pid_t killed_pid = w2->pid();
  w2->Kill();
  EXPECT_THAT(SharedRegionsOf(killed_pid), ::testing::IsEmpty());
  const absl::Time killed = absl::Now();
  const int64_t at_kill = Stats().version();
  // The live set drops worker:2 after the 1 s lease; steps go on without it.
  const int64_t next = WaitForVersion(at_kill + 2, absl::Seconds(10));
  const absl::Duration stalled = absl::Now() - killed;
  const int64_t later = WaitForVersion(at_kill + 20, absl::Seconds(10));
  EXPECT_GE(next, at_kill + 2);
  EXPECT_GE(later, at_kill + 20) << "training stalled after a worker died";
  std::printf("fault: %s: worker:2 SIGKILLed at version %lld; stepping again after %s\n",
              GetParam().c_str(), static_cast<long long>(at_kill),
              absl::FormatDuration(stalled).c_str());
  // When the 1 s lease runs out the PS drops it, on its own timer.
  StatsResponse stats;
  EXPECT_TRUE(Eventually([&] { return !(stats = Stats()).workers(2).live(); },
                         killed + absl::Seconds(5) - absl::Now(), absl::Milliseconds(50)))
      << stats.DebugString();
  // The others stay in the live set while they train (an ASYNC worker may
  // already have finished: then it is done and its lease has run out).
  for (int w : {0, 1}) {
    EXPECT_TRUE(stats.workers(w).live() || stats.workers(w).done()) << stats.DebugString();
  }

  w2 = StartWorker(config, 2);
  EXPECT_EQ(w2->Wait(absl::Seconds(120)), 0) << Log("worker-2.log");
  EXPECT_EQ(w0->Wait(absl::Seconds(120)), 0) << Log("worker-0.log");
  EXPECT_EQ(w1->Wait(absl::Seconds(60)), 0) << Log("worker-1.log");
  EXPECT_THAT(Log("worker-2.log"), ::testing::HasSubstr("rejoins after"));
  EXPECT_GE(Result(0).test_accuracy(), 0.75);
  std::printf("fault: %s: worker:2 restarted and finished; final test accuracy %.4f\n",
              GetParam().c_str(), Result(0).test_accuracy());
}

INSTANTIATE_TEST_SUITE_P(EveryMode, WorkerFaultTest, ::testing::Values("SYNC", "ASYNC", "SSP"));

// The PS is killed with SIGKILL mid-run and restarted; it restores its newest
// checkpoint (the version never goes back by more than the checkpoint
// interval), the workers reconnect, and the run completes well.
TEST_F(FaultTest, PsKilledAndRestartedResumesFromItsCheckpoint) {
  std::string config = WriteConfig(
      2, absl::StrCat("  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 20 }\n"));
  auto ps = StartPs(config);
  auto w0 = StartWorker(config, 0), w1 = StartWorker(config, 1);
  ASSERT_GE(WaitForVersion(100, absl::Seconds(60)), 100) << Log("ps.log");
  const int64_t before = Stats().version();
  ps->Kill();
  const absl::Time killed = absl::Now();
  // Killed mid-answer, the PS leaves none of the workers' segments behind.
  EXPECT_THAT(SharedRegionsOf(w0->pid()), ::testing::IsEmpty());
  EXPECT_THAT(SharedRegionsOf(w1->pid()), ::testing::IsEmpty());
  ps = StartPs(config);
  // The restarted PS says which version it restored before it serves.
  const std::string marker = "restored its checkpoint at version ";
  int64_t restored = -1;
  ASSERT_TRUE(Eventually(
      [&] {
        const std::string log = Log("ps.log");
        const size_t at = log.find(marker);
        if (at != std::string::npos) restored = std::stoll(log.substr(at + marker.size()));
        return restored >= 0;
      },
      absl::Seconds(20), absl::Milliseconds(20)))
      << Log("ps.log");
  const int64_t resumed = WaitForVersion(restored + 1, absl::Seconds(30));
  const absl::Duration recovery = absl::Now() - killed;
  EXPECT_GT(resumed, restored);
  // Checkpoints land exactly on multiples of 20, so at most 20 versions are
  // lost (the version at the kill was at least `before`).
  EXPECT_GE(restored, before - 20) << Log("ps.log");
  EXPECT_EQ(restored % 20, 0);
  EXPECT_EQ(w0->Wait(absl::Seconds(120)), 0) << Log("worker-0.log");
  EXPECT_EQ(w1->Wait(absl::Seconds(60)), 0) << Log("worker-1.log");
  EXPECT_THAT(Log("worker-0.log"), ::testing::HasSubstr("reconnected"));
  // Both workers moved tensors through shared memory with both lives of
  // the PS: they attached new regions to the restarted one.
  EXPECT_EQ(Count(Log("ps.log"), "shared region ("), 4) << Log("ps.log");
  EXPECT_GE(Result(0).test_accuracy(), 0.75);
  std::printf("fault: PS SIGKILLed at version %lld, restored version %lld (%lld steps lost), "
              "training again %s after the kill; final test accuracy %.4f\n",
              static_cast<long long>(before), static_cast<long long>(restored),
              static_cast<long long>(before - restored), absl::FormatDuration(recovery).c_str(),
              Result(0).test_accuracy());
}

// A PS killed and restarted while its worker computes a long step: the
// worker's next push claims a version the restored PS has not reached. The
// PS refuses it as a restart the worker has not seen (the worker registers
// again and runs the step anew), not as bad input, which once ended the run
// with exit 2. The slowed worker (tests/support/slow_worker.cc) sleeps
// 1.5 s before each push: the kill and the restart fall inside one sleep.
TEST_F(FaultTest, AWorkerInALongStepGoesOnAtAPsRestartedMeanwhile) {
  const std::string config = Remember(
      dir_ + "/slow.textproto",
      absl::StrCat("  workers: 1 }\n",
                   "training { optimizer { sgd { learning_rate: 0.05 } } batch_size: 16\n",
                   "  model { mlp { hidden: 8 } } dataset { quadratic { examples: 128 } }\n",
                   "  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 2 }\n}\n"));
  auto ps = StartPs(config);
  auto worker = std::make_unique<ChildProcess>(
      std::vector<std::string>{PST_SLOW_WORKER, "--config=" + config, "--task=worker:0",
                               "--step_delay_ms=1500"},
      dir_ + "/worker-0.log");
  ASSERT_GE(WaitForVersion(3, absl::Seconds(60)), 3) << Log("worker-0.log");
  ps->Kill();
  ps = StartPs(config);
  EXPECT_EQ(worker->Wait(absl::Seconds(120)), 0) << Log("worker-0.log");
  EXPECT_THAT(Log("worker-0.log"), ::testing::HasSubstr("went back to its checkpoint"))
      << "the push never reached the restarted PS (it restarted too slowly?)\n"
      << Log("worker-0.log") << Log("ps.log");
}

// Second hostile pass: a PS that came back without its checkpoints (its
// folder changed under it) was initialized again from the seed, and the
// workers trained on as if nothing was lost. More than a checkpoint
// interval lost is now the workers' error: they stop (exit 2, not
// restarted) and say so.
TEST_F(FaultTest, WorkersStopWhenThePsComesBackWithoutTheModel) {
  std::string config = WriteConfig(
      2, absl::StrCat("  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 20 }\n"));
  auto ps = StartPs(config);
  auto w0 = StartWorker(config, 0), w1 = StartWorker(config, 1);
  ASSERT_GE(WaitForVersion(100, absl::Seconds(60)), 100) << Log("ps.log");
  ps->Kill();
  // Its checkpoints moved aside: it starts from nothing.
  ps = StartPs(config, {}, "--checkpoint_start=fresh", "ps-again.log");
  EXPECT_EQ(w0->Wait(absl::Seconds(120)), 2) << Log("worker-0.log");
  EXPECT_EQ(w1->Wait(absl::Seconds(60)), 2) << Log("worker-1.log");
  EXPECT_THAT(Log("worker-0.log"), ::testing::HasSubstr("came back at version 0 without the model"));
  EXPECT_LT(Stats().version(), 50) << "the workers trained on from the seed";
}

// Every checkpoint in the directory is damaged: the PS refuses to start
// (exit 2, one line naming the directory) instead of starting from the
// initial weights while the workers carry on as if nothing was lost.
TEST_F(FaultTest, PsRefusesToStartWhenNoCheckpointRestores) {
  std::string config = WriteConfig(1, absl::StrCat("  checkpoint { dir: \"", dir_, "/ckpt\" }\n"));
  std::filesystem::create_directories(dir_ + "/ckpt/shard-0");
  std::ofstream(dir_ + "/ckpt/shard-0/ckpt-000000000000700.bin") << "PSTCKPT1 torn by a crash";
  auto ps = StartPs(config);
  EXPECT_EQ(ps->Wait(absl::Seconds(30)), 2) << Log("ps.log");
  std::vector<std::string> errors = ErrorLines("ps.log");
  ASSERT_EQ(errors.size(), 1u) << Log("ps.log");
  EXPECT_THAT(errors[0], ::testing::HasSubstr(dir_ + "/ckpt/shard-0 holds 1 checkpoint file(s) "
                                              "and none restores"));
  EXPECT_THAT(errors[0], ::testing::HasSubstr("--checkpoint_start=fresh"));
}

// Checkpoint writes fail (a file-size limit stands in for a full disk): the
// PS holds pushes at the scheduled checkpoint while it retries, then stops
// with one line and a non-zero code, leaving no temporary files. The
// version never runs past the checkpoint that could not be written, and
// the workers outlive the PS's stop.
TEST_F(FaultTest, PsStopsWhenCheckpointsKeepFailing) {
  std::string config = WriteConfig(
      2, absl::StrCat("  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 20 max_failures: 3 }\n"));
  auto ps = StartPs(config, {"/usr/bin/prlimit", "--fsize=65536", "--"});
  auto w0 = StartWorker(config, 0), w1 = StartWorker(config, 1);
  int code = -1;
  int64_t highest = 0;
  for (absl::Time deadline = absl::Now() + absl::Seconds(90); code < 0 && absl::Now() < deadline;) {
    code = ps->Wait(absl::Milliseconds(100));
    if (absl::StatusOr<StatsResponse> stats = TryStats(absl::Seconds(1)); stats.ok()) {
      highest = std::max(highest, stats->version());
    }
  }
  EXPECT_EQ(code, 1) << Log("ps.log");
  EXPECT_EQ(highest, 20) << "the model ran ahead of the disk";
  std::vector<std::string> errors = ErrorLines("ps.log");
  ASSERT_FALSE(errors.empty()) << Log("ps.log");
  EXPECT_THAT(errors.back(), ::testing::HasSubstr("ps_server: error: ps:0: checkpoint at version 20"));
  EXPECT_THAT(errors.back(), ::testing::HasSubstr("failed 3 times in a row"));
  EXPECT_THAT(Log("ps.log"), ::testing::HasSubstr("checkpoint failed (1 in a row"));
  EXPECT_THAT(FilesUnder(dir_ + "/ckpt"), ::testing::IsEmpty());
  // The workers wait for the PS to come back (its supervisor restarts it),
  // whatever its stopping answered their calls with, and finish.
  ps = StartPs(config);
  EXPECT_EQ(w0->Wait(absl::Seconds(120)), 0) << Log("worker-0.log");
  EXPECT_EQ(w1->Wait(absl::Seconds(60)), 0) << Log("worker-1.log");
}

// A finished run's checkpoints are not taken for a new run's: a new PS in
// the directory refuses to start; told to restore, it does, and the chief,
// with nothing left to train, does not report success; told to start fresh,
// it trains from the initial weights.
TEST_F(FaultTest, ANewRunInAFinishedRunsDirectoryIsRefused) {
  std::string config =
      WriteTinyConfig(absl::StrCat("  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 5 }\n"));
  auto ps = StartPs(config);
  EXPECT_EQ(StartWorker(config, 0)->Wait(absl::Seconds(60)), 0) << Log("worker-0.log");
  ps->Signal(SIGTERM);
  ASSERT_EQ(ps->Wait(absl::Seconds(30)), 0) << Log("ps.log");

  auto again = StartPs(config, {}, "", "ps-again.log");
  EXPECT_EQ(again->Wait(absl::Seconds(30)), 2) << Log("ps-again.log");
  ASSERT_EQ(ErrorLines("ps-again.log").size(), 1u) << Log("ps-again.log");
  EXPECT_THAT(ErrorLines("ps-again.log")[0],
              ::testing::HasSubstr("holds the final checkpoint of a finished run (version 16"));

  auto restored = StartPs(config, {}, "--checkpoint_start=restore", "ps-restore.log");
  auto idle = StartWorker(config, 0);
  EXPECT_EQ(idle->Wait(absl::Seconds(60)), 2) << Log("worker-0.log");
  EXPECT_THAT(Log("worker-0.log"), ::testing::HasSubstr("no training happened: ps:0 restored version 16"));
  restored->Kill();

  auto fresh = StartPs(config, {}, "--checkpoint_start=fresh", "ps-fresh.log");
  EXPECT_EQ(StartWorker(config, 0)->Wait(absl::Seconds(60)), 0) << Log("worker-0.log");
  EXPECT_EQ(Result(0).steps(), 16);
  EXPECT_THAT(FilesUnder(dir_ + "/ckpt/shard-0/previous"),
              ::testing::Contains("ckpt-000000000000016.bin"));
}

// A worker killed and never restarted: the chief still evaluates the final
// model once the worker has been gone for pull_timeout_seconds, reports its
// accuracy and names the missing worker, and exits 0
// (training.require_all_workers is off).
// Idle TCP connections to `port` on 127.0.0.1 from `source` (another
// loopback address), as many as `count`; their descriptors, to close. The
// first call that failed, with its errno, in `error`.
std::vector<int> OpenIdleConnections(int port, const char* source, int count, std::string* error) {
  std::vector<int> sockets;
  for (int i = 0; i < count; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = absl::StrCat("socket: ", strerror(errno));
      break;
    }
    // The source port is chosen at connect(), knowing the peer: one chosen
    // at bind() may be a pair still in TIME_WAIT from an earlier test's
    // connection to a server on the same port (EADDRNOTAVAIL).
    const int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source, &from.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      *error = absl::StrCat("connection ", i + 1, ": ", strerror(errno));
      close(fd);
      break;
    }
    sockets.push_back(fd);
  }
  return sockets;
}

// A local process holds 1100 idle connections to a PS whose descriptor
// limit is 256 (a hostile neighbour's first-round finding: the PS ran out
// of descriptors, could not write its checkpoints and stopped itself). The
// PS caps connections as they are accepted, per source and in total,
// keeping descriptors for its own files: the workers connect and finish,
// every checkpoint is written, and the refused connections are counted.
TEST_F(FaultTest, IdleConnectionsCannotTakeThePsDescriptors) {
  rlimit files{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);
  ASSERT_GE(files.rlim_cur, 1200u) << "this test needs 1200 descriptors of its own";
  std::string config = WriteConfig(
      2, absl::StrCat("  checkpoint { dir: \"", dir_, "/ckpt\" every_steps: 20 }\n"),
      /*pull_timeout_seconds=*/60, /*epochs=*/1);
  auto ps = StartPs(config, {"/usr/bin/prlimit", "--nofile=256:256", "--"});
  ASSERT_TRUE(TryStats(absl::Seconds(30)).ok()) << Log("ps.log");
  const int port = std::stoi(address_.substr(address_.rfind(':') + 1));
  std::string error;
  std::vector<int> held = OpenIdleConnections(port, "127.0.0.2", 1100, &error);
  EXPECT_EQ(held.size(), 1100u) << error;
  auto w0 = StartWorker(config, 0), w1 = StartWorker(config, 1);
  EXPECT_EQ(w0->Wait(absl::Seconds(120)), 0) << Log("worker-0.log");
  EXPECT_EQ(w1->Wait(absl::Seconds(60)), 0) << Log("worker-1.log");
  const StatsResponse stats = Stats();
  EXPECT_GE(stats.connections_refused(), 1100 - 128);
  EXPECT_EQ(stats.descriptor_shortages(), 0);
  EXPECT_EQ(stats.checkpoint().failures(), 0) << stats.checkpoint().last_error();
  EXPECT_GE(stats.checkpoint().written(), 1);
  EXPECT_EQ(ps->Wait(absl::ZeroDuration()), -1) << "the PS stopped: " << Log("ps.log");
  for (int fd : held) close(fd);
}

TEST_F(FaultTest, ChiefReportsTheModelWhenAWorkerIsGoneForGood) {
  std::string config = WriteConfig(2, "", /*pull_timeout_seconds=*/3);
  auto ps = StartPs(config);
  auto w0 = StartWorker(config, 0), w1 = StartWorker(config, 1);
  ASSERT_TRUE(Eventually([&] { return Stats().workers(1).clock() > 0; }, absl::Seconds(60),
                         absl::Milliseconds(20)))
      << Log("worker-1.log");
  w1->Kill();
  EXPECT_EQ(w0->Wait(absl::Seconds(120)), 0) << Log("worker-0.log");
  WorkerResult chief = Result(0);
  EXPECT_THAT(chief.missing_workers(), ::testing::ElementsAre(1));
  EXPECT_TRUE(chief.has_test_accuracy());
  EXPECT_GE(chief.test_accuracy(), 0.7);
  EXPECT_THAT(Log("worker-0.log"), ::testing::HasSubstr("(without worker:1: gone for good"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
