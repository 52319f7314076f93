// The shipped binaries as a user runs them: pslaunch starting real ps_server
// and worker processes on loopback, and the one-line errors of each binary.
// Every command runs under `timeout`, and pslaunch reaps its own children.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "result.pb.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CommandResult RunCommand(const std::string& command, int timeout_seconds) {
  std::string dir = ::testing::TempDir();
  std::string out = dir + "/cmd.out", err = dir + "/cmd.err";
  std::string line = absl::StrCat("timeout -k 5 ", timeout_seconds, " ", command, " >", out,
                                  " 2>", err, " </dev/null");
  int status = std::system(line.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFile(out);
  result.err = ReadFile(err);
  return result;
}

// A port on 127.0.0.1 that nothing listens on right now.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

std::string WriteConfig(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
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
