// A cluster started the way TensorFlow launchers start one: every process
// given the same job file (no cluster in it) and its own TF_CONFIG, no
// --task, no pslaunch. 1 PS + a chief + a worker on loopback; the PS binds
// port 0 (its TF_CONFIG names port 0) and reports the port it got, which the
// workers' TF_CONFIG then names. With PSTRAIN_PS_REPLICAS and PSTRAIN_ETCD,
// TF_CONFIG's ps tasks are a shard's primary and backup, and the backup
// takes over when the primary is killed. Every process is killed at the end
// by PID.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/membership/local_etcd.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "result.pb.h"
#include "tests/cluster/membership/etcd_server.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"
#include "tests/support/shard_stats.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The cluster as the launcher sees it; `ps` lists the PS tasks' addresses.
std::string TfConfig(const std::vector<std::string>& ps, const std::string& type, int index = 0) {
  return absl::StrCat(R"({"cluster": {"ps": [")", absl::StrJoin(ps, R"(", ")"),
                      R"("], "chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},)",
                      R"( "task": {"type": ")", type, R"(", "index": )", index, "}}");
}
std::string TfConfig(const std::string& ps, const std::string& type) {
  return TfConfig(std::vector<std::string>{ps}, type);
}

class TfConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ScratchDir();
    job_ = dir_ + "/job.textproto";
    std::ofstream(job_) << "training { mode: SYNC optimizer { sgd { learning_rate: 0.05 } }\n"
                           "  batch_size: 16 epochs: 2\n"
                           "  model { mlp { hidden: 8 } } dataset { quadratic { examples: 256 } } }\n";
  }

  WorkerResult Result(const std::string& name) {
    std::stringstream text;
    text << std::ifstream(dir_ + "/" + name).rdbuf();
    WorkerResult result;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &result).ok()) << name;
    return result;
  }

  // A job of 40 epochs, with leases of 1 s.
  void WriteReplicatedJob() {
    std::ofstream(job_)
        << "cluster { membership { lease_seconds: 1 } }\n"
           "training { mode: SYNC optimizer { sgd { learning_rate: 0.05 } }\n"
           "  batch_size: 16 epochs: 40\n"
           "  model { mlp { hidden: 8 } } dataset { quadratic { examples: 256 } } }\n";
  }

  // An etcd of the test's own, and two free loopback addresses for a
  // shard's replicas, with the environment that names them.
  struct TwoReplicas {
    std::unique_ptr<EtcdServer> etcd;
    std::vector<std::string> replicas;
    std::vector<std::pair<std::string, std::string>> env;
  };
  static absl::StatusOr<TwoReplicas> StartEtcdForTwoReplicas() {
    TwoReplicas cluster;
    PST_ASSIGN_OR_RETURN(cluster.etcd, EtcdServer::Start());
    PST_ASSIGN_OR_RETURN(std::vector<int> ports, FreeLoopbackPorts(2));
    cluster.replicas = {absl::StrCat("127.0.0.1:", ports[0]), absl::StrCat("127.0.0.1:", ports[1])};
    cluster.env = {{"PSTRAIN_PS_REPLICAS", "2"}, {"PSTRAIN_ETCD", cluster.etcd->endpoint()}};
    return cluster;
  }

  std::string dir_;
  std::string job_;
};

TEST_F(TfConfigTest, OnePsAChiefAndAWorkerTrainFromTfConfigAlone) {
  const std::string port_file = dir_ + "/ps.port";
  ChildProcess ps({Bin("ps_server"), "--config=" + job_, "--port_file=" + port_file},
                  dir_ + "/ps.log", {{"TF_CONFIG", TfConfig("127.0.0.1:0", "ps")}});
  const int port = AwaitPortFile(port_file, ps.pid());
  ASSERT_GT(port, 0) << ReadFile(dir_ + "/ps.log");
  const std::string address = absl::StrCat("127.0.0.1:", port);

  // TF_CONFIG's chief is worker:0, its worker 0 is worker:1.
  ChildProcess chief(
      {Bin("worker"), "--config=" + job_, "--result_file=" + dir_ + "/chief.json"},
      dir_ + "/chief.log", {{"TF_CONFIG", TfConfig(address, "chief")}});
  ChildProcess worker(
      {Bin("worker"), "--config=" + job_, "--result_file=" + dir_ + "/worker.json"},
      dir_ + "/worker.log", {{"TF_CONFIG", TfConfig(address, "worker")}});
  ASSERT_EQ(chief.Wait(absl::Seconds(120)), 0) << ReadFile(dir_ + "/chief.log");
  ASSERT_EQ(worker.Wait(absl::Seconds(30)), 0) << ReadFile(dir_ + "/worker.log");

  const WorkerResult chief_result = Result("chief.json");
  const WorkerResult worker_result = Result("worker.json");
  EXPECT_EQ(chief_result.task(), "worker:0");
  EXPECT_EQ(worker_result.task(), "worker:1");
  EXPECT_EQ(chief_result.evals_size(), 2);  // the chief evaluates after every epoch
  EXPECT_EQ(worker_result.evals_size(), 0);
  EXPECT_TRUE(chief_result.missing_workers().empty());
  // SYNC over two workers: 256 examples / (2 x 16) = 8 steps an epoch each,
  // and every step took both gradients.
  EXPECT_EQ(chief_result.steps(), 16);
  EXPECT_EQ(worker_result.steps(), 16);
  EXPECT_EQ(chief_result.final_version(), 16);

  ps.Signal(SIGTERM);
  EXPECT_EQ(ps.Wait(absl::Seconds(30)), 0) << ReadFile(dir_ + "/ps.log");
  EXPECT_THAT(ReadFile(dir_ + "/ps.log"), HasSubstr("ps:0 serving"));
}

// A TFJob with two PS replicas and PSTRAIN_PS_REPLICAS=2: ps:0 is the
// shard's primary, ps:1 its backup, their membership in the etcd that
// PSTRAIN_ETCD names. The primary is killed with SIGKILL mid-run; the backup
// takes office, and the job ends as a run of one unreplicated PS does: the
// same steps, version and losses, to the last bit.
TEST_F(TfConfigTest, AReplicatedShardTakesOverAndTheJobEndsAsWithoutTheKill) {
  WriteReplicatedJob();
  const auto train = [&](const std::vector<std::string>& ps, const std::string& name,
                         const std::vector<std::pair<std::string, std::string>>& env) {
    std::vector<std::unique_ptr<ChildProcess>> workers;
    for (const std::string type : {"chief", "worker"}) {
      auto with_task = env;
      with_task.emplace_back("TF_CONFIG", TfConfig(ps, type));
      workers.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{
              Bin("worker"), "--config=" + job_,
              absl::StrCat("--result_file=", dir_, "/", name, "-", type, ".json")},
          absl::StrCat(dir_, "/", name, "-", type, ".log"), with_task));
    }
    return workers;
  };

  // Without replicas, and without a kill.
  const std::string port_file = dir_ + "/plain.port";
  ChildProcess plain_ps({Bin("ps_server"), "--config=" + job_, "--port_file=" + port_file},
                        dir_ + "/plain-ps.log", {{"TF_CONFIG", TfConfig("127.0.0.1:0", "ps")}});
  const int port = AwaitPortFile(port_file, plain_ps.pid());
  ASSERT_GT(port, 0) << ReadFile(dir_ + "/plain-ps.log");
  for (auto& worker : train({absl::StrCat("127.0.0.1:", port)}, "plain", {})) {
    ASSERT_EQ(worker->Wait(absl::Seconds(120)), 0) << ReadFile(dir_ + "/plain-chief.log");
  }

  absl::StatusOr<TwoReplicas> cluster = StartEtcdForTwoReplicas();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::string>& replicas = cluster->replicas;
  const std::vector<std::pair<std::string, std::string>>& env = cluster->env;
  std::vector<std::unique_ptr<ChildProcess>> ps;
  for (int index = 0; index < 2; ++index) {
    auto with_task = env;
    with_task.emplace_back("TF_CONFIG", TfConfig(replicas, "ps", index));
    ps.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{Bin("ps_server"), "--config=" + job_},
        absl::StrCat(dir_, "/replica-", index, ".log"), with_task));
  }
  // The workers' TF_CONFIG lists both replicas too: the backup is where
  // they go when the primary is gone.
  std::vector<std::unique_ptr<ChildProcess>> workers = train(replicas, "replicated", env);
  // 40 epochs of 8 steps: killed a quarter of the way, once the backup is
  // in the chain (on a loaded machine its catch-up can outlast 80 steps,
  // and a backup outside the chain rightly does not take the office).
  ASSERT_TRUE(AwaitBackupsInChain(replicas[0], absl::Seconds(120)))
      << ReadFile(dir_ + "/replica-0.log");
  ASSERT_GE(AwaitVersion(replicas[0], 80, absl::Seconds(120)), 80)
      << ReadFile(dir_ + "/replica-0.log");
  ps[0]->Signal(SIGKILL);
  for (auto& worker : workers) {
    ASSERT_EQ(worker->Wait(absl::Seconds(120)), 0) << ReadFile(dir_ + "/replicated-chief.log");
  }
  // The backup takes the office once the lease runs out, which may come
  // after the workers ended (a kill near the run's end).
  Eventually(
      [&] {
        return ReadFile(dir_ + "/replica-1.log").find("is primary at epoch 2") != std::string::npos;
      },
      absl::Seconds(30), absl::Milliseconds(20));
  EXPECT_THAT(ReadFile(dir_ + "/replica-1.log"), HasSubstr("is primary at epoch 2"));

  // psctl, given the same TF_CONFIG as the workers, finds the shard at its
  // new primary: replica 1 at epoch 2, replica 0 gone.
  const CommandResult status = RunCommand(
      absl::StrCat("env TF_CONFIG='", TfConfig(replicas, "chief"), "' PSTRAIN_PS_REPLICAS=2 ",
                   "PSTRAIN_ETCD=", cluster->etcd->endpoint(), " ", Bin("psctl"),
                   " status --config=", job_),
      60);
  EXPECT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, ::testing::ContainsRegex(absl::StrCat("ps:0 +", replicas[1], " ")))
      << status.out;
  EXPECT_THAT(status.out, ::testing::ContainsRegex("ps:0 +1 +2 +[0-9]+ +0 +NO ")) << status.out;

  for (const std::string type : {"chief", "worker"}) {
    SCOPED_TRACE(type);
    const WorkerResult plain = Result("plain-" + type + ".json");
    const WorkerResult replicated = Result("replicated-" + type + ".json");
    EXPECT_EQ(replicated.steps(), 320);
    EXPECT_EQ(replicated.steps(), plain.steps());
    EXPECT_EQ(replicated.final_version(), plain.final_version());
    EXPECT_EQ(replicated.final_loss(), plain.final_loss());
    EXPECT_EQ(replicated.test_loss(), plain.test_loss());
  }
}

// A backup that starts after its primary's first update joins the chain
// (the primary's sender asks it again while it is out, with or without
// updates to forward), and its workers finish: the shard has a replica
// that may take over again.
TEST_F(TfConfigTest, ABackupStartedAfterTrainingBeganJoinsTheChain) {
  WriteReplicatedJob();
  absl::StatusOr<TwoReplicas> cluster = StartEtcdForTwoReplicas();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::string>& replicas = cluster->replicas;
  const std::vector<std::pair<std::string, std::string>>& env = cluster->env;
  const auto start = [&](const std::string& type, int index, const std::string& name) {
    auto with_task = env;
    with_task.emplace_back("TF_CONFIG", TfConfig(replicas, type, index));
    std::vector<std::string> argv = {Bin(type == "ps" ? "ps_server" : "worker"),
                                     "--config=" + job_};
    if (type != "ps") argv.push_back(absl::StrCat("--result_file=", dir_, "/", name, ".json"));
    return std::make_unique<ChildProcess>(argv, absl::StrCat(dir_, "/", name, ".log"), with_task);
  };
  std::unique_ptr<ChildProcess> primary = start("ps", 0, "replica-0");
  std::unique_ptr<ChildProcess> chief = start("chief", 0, "chief");
  std::unique_ptr<ChildProcess> worker = start("worker", 0, "worker");
  ASSERT_GE(AwaitVersion(replicas[0], 2, absl::Seconds(60)), 2)
      << ReadFile(dir_ + "/replica-0.log");
  std::unique_ptr<ChildProcess> backup = start("ps", 1, "replica-1");
  EXPECT_TRUE(AwaitBackupsInChain(replicas[0], absl::Seconds(30)))
      << ReadFile(dir_ + "/replica-0.log");
  EXPECT_THAT(ReadFile(dir_ + "/replica-0.log"), HasSubstr("backup 1 at"));
  for (ChildProcess* process : {chief.get(), worker.get()}) {
    ASSERT_EQ(process->Wait(absl::Seconds(120)), 0) << ReadFile(dir_ + "/chief.log");
  }
}

TEST_F(TfConfigTest, AConflictIsOneLineAndExitCodeTwo) {
  struct Case {
    std::string name;
    std::string command;  // after TF_CONFIG=...
    std::string error;
  };
  const std::string own_cluster = dir_ + "/own_cluster.textproto";
  std::ofstream(own_cluster) << "cluster { ps: \"127.0.0.1:7000\" workers: 2 }\n"
                             << ReadFile(job_);
  const std::string tf_config = TfConfig("127.0.0.1:7001", "ps");
  std::vector<Case> cases = {
      {"--task", Bin("ps_server") + " --check_config --config=" + job_ + " --task=ps:1",
       "ps_server: error: --task=ps:1 but TF_CONFIG's task is ps:0"},
      {"another program's task", Bin("worker") + " --check_config --config=" + job_,
       "worker: error: TF_CONFIG names task ps:0 but worker runs worker:<index> tasks"},
      {"the config's cluster", Bin("ps_server") + " --check_config --config=" + own_cluster,
       absl::StrCat("ps_server: error: TF_CONFIG lists ps [127.0.0.1:7001] but ", own_cluster,
                    " has cluster.ps [127.0.0.1:7000]")},
      {"--workers", Bin("psctl") + " status --config=" + job_ + " --workers=3",
       "psctl: error: TF_CONFIG lists 2 worker(s) (chief included) but"},
      {"pslaunch", Bin("pslaunch") + " --config=" + job_,
       "pslaunch: error: TF_CONFIG is set, which gives each process one task"},
      {"--replica", Bin("ps_server") + " --check_config --config=" + job_ + " --replica=1",
       "ps_server: error: --replica=1 but TF_CONFIG's task is replica 0 of shard 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const CommandResult result =
        RunCommand(absl::StrCat("env TF_CONFIG='", tf_config, "' ", c.command), 60);
    EXPECT_EQ(result.exit_code, 2) << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.error));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  }
  // A replica the config does not have fails the check too.
  const CommandResult no_such_replica = RunCommand(
      absl::StrCat(Bin("ps_server"), " --check_config --config=", own_cluster, " --replica=2"), 60);
  EXPECT_EQ(no_such_replica.exit_code, 2) << no_such_replica.err;
  EXPECT_THAT(no_such_replica.err,
              HasSubstr("--replica=2: shard 0 has 1 replica(s) in cluster.ps and "
                        "cluster.ps_backups; give 0"));
  // The same TF_CONFIG and job file pass the check as the PS's own.
  const CommandResult ok = RunCommand(
      absl::StrCat("env TF_CONFIG='", tf_config, "' ", Bin("ps_server"), " --check_config --config=", job_),
      60);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("config OK: 1 ps shard(s), 2 worker(s)"));
}

// A TF_CONFIG that is not JSON at all: one line from every program that
// reads it (protobuf's parser quotes the text and points under it on lines
// of their own, which the error leaves out), exit code 2.
TEST_F(TfConfigTest, TextThatIsNotJsonIsOneLineAndExitCodeTwo) {
  for (const std::string program : {"ps_server", "worker"}) {
    SCOPED_TRACE(program);
    const CommandResult result = RunCommand(
        absl::StrCat("env TF_CONFIG='not json' ", Bin(program), " --check_config --config=", job_), 60);
    EXPECT_EQ(result.exit_code, 2) << result.err;
    EXPECT_THAT(result.err, HasSubstr(program + ": error: TF_CONFIG is not a JSON object (Unexpected token.)"));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
