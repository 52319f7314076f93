// A cluster started the way TensorFlow launchers start one: every process
// given the same job file (no cluster in it) and its own TF_CONFIG, no
// --task, no pslaunch. 1 PS + a chief + a worker on loopback; the PS binds
// port 0 (its TF_CONFIG names port 0) and reports the port it got, which the
// workers' TF_CONFIG then names. Every process is killed at the end by PID.
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
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "result.pb.h"
#include "tests/support/commands.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The cluster as the launcher sees it; `ps` is the PS's address.
std::string TfConfig(const std::string& ps, const std::string& type) {
  return absl::StrCat(R"({"cluster": {"ps": [")", ps,
                      R"("], "chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},)",
                      R"( "task": {"type": ")", type, R"(", "index": 0}})");
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
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const CommandResult result =
        RunCommand(absl::StrCat("env TF_CONFIG='", tf_config, "' ", c.command), 60);
    EXPECT_EQ(result.exit_code, 2) << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.error));
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  }
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

}  // namespace
}  // namespace pst
