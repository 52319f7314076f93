// The shipped binaries over TLS with the cluster token: pslaunch starts a PS
// and two workers on loopback with mutual TLS and a token file, and they
// train to the end; a PS asked to serve plaintext beyond loopback refuses.
// Every command runs under `timeout`; pslaunch reaps its own children.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"
#include "result.pb.h"
#include "tests/support/test_certificates.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ScratchDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A small Fashion-MNIST job whose cluster section is `cluster_extra` plus
// one PS at `ps` and two workers. Port 0 by default: the PS binds a port the
// system picks, and pslaunch gives the workers that port.
std::string Config(const std::string& cluster_extra, const std::string& ps = "127.0.0.1:0") {
  return absl::StrCat(R"(
cluster { ps: ")", ps, R"(" workers: 2 )", cluster_extra, R"( }
training {
  optimizer { adam { learning_rate: 0.001 } }
  batch_size: 64
  epochs: 1
  model { mlp { hidden: 64 } }
  dataset { fashion_mnist { train_limit: 4000 } }
})");
}

TEST(SecureTrainingTest, MutualTlsWithATokenTrainsToTheEnd) {
  absl::StatusOr<TestCertificates> certs = MakeTestCertificates(ScratchDir());
  ASSERT_TRUE(certs.ok()) << certs.status();
  std::string token = WriteFile("cluster.token", "e2e-token-0123456789\n");
  std::string config = WriteFile(
      "secure.textproto",
      Config(absl::StrCat("tls { cert: \"", certs->cert, "\" key: \"", certs->key, "\" ca: \"",
                          certs->ca, "\" require_client_cert: true } auth { token_file: \"",
                          token, "\" }")));
  CommandResult run = RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", config), 300);
  ASSERT_EQ(run.exit_code, 0) << run.err << run.out;
  EXPECT_THAT(run.out + run.err, HasSubstr("TLS + token"));
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  RunSummary summary;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(lines.back(), &summary).ok())
      << lines.back();
  EXPECT_EQ(summary.workers(), 2);
  EXPECT_GT(summary.steps(), 0);
  // 4000 images, one epoch: far above the 0.1 of guessing.
  EXPECT_GE(summary.test_accuracy(), 0.6);
}

TEST(SecureTrainingTest, PlaintextBeyondLoopbackIsRefusedUnlessAllowed) {
  std::string config = WriteFile("plain.textproto", Config(""));
  std::string listen = "0.0.0.0:0";
  CommandResult refused = RunCommand(
      absl::StrCat(Bin("ps_server"), " --config=", config, " --listen=", listen), 30);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_EQ(refused.err,
            absl::StrCat("ps_server: error: refusing to serve plaintext on ", listen,
                         ", which other machines can reach; configure cluster.tls or pass "
                         "--allow_insecure on a trusted network\n"));

  // Allowed: it serves, and stops on SIGTERM from `timeout` (exit 124).
  CommandResult allowed = RunCommand(
      absl::StrCat(Bin("ps_server"), " --config=", config, " --listen=", listen,
                   " --allow_insecure"),
      3);
  EXPECT_EQ(allowed.exit_code, 124) << allowed.err;
  EXPECT_THAT(allowed.out + allowed.err, HasSubstr("plaintext"));
}

TEST(SecureTrainingTest, AWorkerWithoutTheCaFileSaysWhichFile) {
  // A worker takes no port 0; it stops at the CA file before it connects.
  std::string config = WriteFile(
      "no_ca.textproto",
      Config(absl::StrCat("tls { ca: \"", ScratchDir(), "/absent-ca.pem\" }"), "127.0.0.1:1"));
  CommandResult run = RunCommand(
      absl::StrCat(Bin("worker"), " --config=", config, " --task=worker:0"), 30);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("cannot read cluster.tls.ca file " + ScratchDir() +
                                 "/absent-ca.pem; check the path and its permissions"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
