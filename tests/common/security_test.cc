// TLS and the cluster token: a PS with cluster.tls and cluster.auth serves
// only clients that trust its CA, present the token and, under mutual TLS,
// a certificate of its CA. Certificates come from openssl, made per run.
#include "common/security.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps.grpc.pb.h"
#include "ps_server/parameter_shard.h"
#include "ps_server/ps_service.h"
#include "tests/support/test_certificates.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

constexpr char kTokenEnv[] = "PST_SECURITY_TEST_TOKEN";

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/security_test.", getpid()));
    std::filesystem::create_directories(*dir_);
    absl::StatusOr<TestCertificates> certs = MakeTestCertificates(*dir_);
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = new TestCertificates(*certs);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete certs_;
    delete dir_;
  }

  void SetUp() override { setenv(kTokenEnv, "s3cret-token", 1); }
  void TearDown() override {
    unsetenv(kTokenEnv);
    for (auto& server : servers_) server.grpc_server->Shutdown();
    for (auto& shard : shards_) shard->BeginShutdown();
  }

  // cluster.tls from our CA and certificate, cluster.auth from kTokenEnv.
  static ClusterConfig SecureCluster(bool require_client_cert) {
    ClusterConfig cluster;
    TlsConfig* tls = cluster.mutable_tls();
    tls->set_ca(certs_->ca);
    tls->set_cert(certs_->cert);
    tls->set_key(certs_->key);
    tls->set_require_client_cert(require_client_cert);
    cluster.mutable_auth()->set_token_env(kTokenEnv);
    return cluster;
  }

  // Starts a PS shard secured by `cluster`; returns its address.
  std::string StartServer(const ClusterConfig& cluster) {
    absl::StatusOr<ClusterSecurity> security =
        ClusterSecurity::FromConfig(cluster, ClusterSecurity::Role::kServer);
    EXPECT_TRUE(security.ok()) << security.status();
    ShardOptions options;
    options.optimizer.mutable_sgd()->set_learning_rate(0.1f);
    absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
    EXPECT_TRUE(shard.ok()) << shard.status();
    absl::StatusOr<RunningServer> server =
        StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{}, *security);
    EXPECT_TRUE(server.ok()) << server.status();
    std::string address = absl::StrCat("127.0.0.1:", server->port);
    shards_.push_back(std::move(*shard));
    servers_.push_back(std::move(*server));
    return address;
  }

  // One Stats call from a client secured by `cluster` (a client-side view).
  static grpc::Status CallStats(const std::string& address, const ClusterConfig& cluster) {
    absl::StatusOr<ClusterSecurity> security =
        ClusterSecurity::FromConfig(cluster, ClusterSecurity::Role::kClient);
    if (!security.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "bad client config");
    grpc::ChannelArguments args;
    security->ConfigureChannel(&args);
    auto stub = ParameterServer::NewStub(
        grpc::CreateCustomChannel(address, security->ChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    StatsRequest request;
    StatsResponse response;
    return stub->Stats(&context, request, &response);
  }

  static std::string* dir_;
  static TestCertificates* certs_;
  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::vector<RunningServer> servers_;
};

std::string* SecurityTest::dir_ = nullptr;
TestCertificates* SecurityTest::certs_ = nullptr;

TEST_F(SecurityTest, TheRightTokenOverTlsIsServed) {
  std::string address = StartServer(SecureCluster(false));
  grpc::Status status = CallStats(address, SecureCluster(false));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(SecurityTest, AMissingOrWrongTokenIsUnauthenticated) {
  std::string address = StartServer(SecureCluster(false));
  ClusterConfig no_token = SecureCluster(false);
  no_token.clear_auth();
  grpc::Status missing = CallStats(address, no_token);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("carried none"));

  std::string token_file = *dir_ + "/wrong.token";
  std::ofstream(token_file) << "s3cret-tokeN\n";
  ClusterConfig wrong_token = SecureCluster(false);
  wrong_token.mutable_auth()->Clear();
  wrong_token.mutable_auth()->set_token_file(token_file);
  grpc::Status wrong = CallStats(address, wrong_token);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.error_message(), HasSubstr("does not match"));
}

TEST_F(SecurityTest, ATokenFileServesLikeTheEnvironment) {
  std::string token_file = *dir_ + "/right.token";
  std::ofstream(token_file) << "  s3cret-token\n";  // whitespace around it is not part of it
  ClusterConfig from_file = SecureCluster(false);
  from_file.mutable_auth()->Clear();
  from_file.mutable_auth()->set_token_file(token_file);
  std::string address = StartServer(SecureCluster(false));
  grpc::Status status = CallStats(address, from_file);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(SecurityTest, APlaintextClientCannotTalkToATlsServer) {
  std::string address = StartServer(SecureCluster(false));
  grpc::Status status = CallStats(address, ClusterConfig());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(SecurityTest, AClientThatDoesNotTrustTheServerCaFails) {
  std::string address = StartServer(SecureCluster(false));
  ClusterConfig other_ca = SecureCluster(false);
  other_ca.mutable_tls()->set_ca(certs_->other_ca);
  grpc::Status status = CallStats(address, other_ca);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(SecurityTest, MutualTlsRejectsClientCertificatesOfAnotherCa) {
  std::string address = StartServer(SecureCluster(true));
  grpc::Status good = CallStats(address, SecureCluster(true));
  EXPECT_TRUE(good.ok()) << good.error_message();

  // The client trusts the server, but its own certificate is signed by a CA
  // the server does not know.
  ClusterConfig foreign = SecureCluster(true);
  foreign.mutable_tls()->set_cert(certs_->other_cert);
  foreign.mutable_tls()->set_key(certs_->other_key);
  grpc::Status status = CallStats(address, foreign);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();

  // No client certificate at all.
  ClusterConfig anonymous = SecureCluster(false);
  grpc::Status none = CallStats(address, anonymous);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAVAILABLE) << none.error_message();
}

TEST_F(SecurityTest, MissingFilesAndTokensAreNamed) {
  struct Case {
    std::string name;
    ClusterConfig cluster;
    ClusterSecurity::Role role;
    std::string message;
  };
  ClusterConfig no_key = SecureCluster(false);
  no_key.mutable_tls()->set_key(*dir_ + "/absent.key");
  ClusterConfig no_ca = SecureCluster(false);
  no_ca.mutable_tls()->set_ca("");
  ClusterConfig unset_env = SecureCluster(false);
  unset_env.mutable_auth()->set_token_env("PST_SECURITY_TEST_UNSET");
  std::vector<Case> cases = {
      {"server key missing", no_key, ClusterSecurity::Role::kServer,
       "cannot read cluster.tls.key file " + *dir_ + "/absent.key"},
      {"client needs the ca", no_ca, ClusterSecurity::Role::kClient,
       "config field cluster.tls.ca is empty"},
      {"token variable unset", unset_env, ClusterSecurity::Role::kClient,
       "the token in environment variable PST_SECURITY_TEST_UNSET (cluster.auth.token_env) is empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ClusterSecurity> security = ClusterSecurity::FromConfig(c.cluster, c.role);
    ASSERT_FALSE(security.ok());
    EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(security.status().message()), HasSubstr(c.message));
  }
}

TEST(ListenAddressTest, PlaintextOnlyOnLoopbackUnlessAllowed) {
  struct Case {
    std::string address;
    bool loopback;
  };
  std::vector<Case> cases = {
      {"127.0.0.1:50051", true},  {"127.1.2.3:1", true},     {"localhost:50051", true},
      {"[::1]:50051", true},      {"0.0.0.0:50051", false},  {"[::]:50051", false},
      {"10.0.0.1:50051", false},  {"ps:50051", false},       {"127.0.0.1.example:1", false},
      {"ps-0.ps:50051", false},   {"128.0.0.1:1", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.address);
    EXPECT_EQ(IsLoopbackAddress(c.address), c.loopback);
    absl::Status plain = CheckListenAddress(c.address, ClusterSecurity::Plaintext(), false);
    EXPECT_EQ(plain.ok(), c.loopback);
    if (!plain.ok()) {
      EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(plain.message()), HasSubstr("--allow_insecure"));
    }
    EXPECT_TRUE(CheckListenAddress(c.address, ClusterSecurity::Plaintext(), true).ok());
    // Allowed, but said out loud: anyone who can reach it can change the model.
    std::optional<std::string> warning =
        InsecureListenWarning(c.address, ClusterSecurity::Plaintext(), true);
    EXPECT_EQ(warning.has_value(), !c.loopback);
    if (warning) {
      EXPECT_THAT(*warning, HasSubstr(c.address));
      EXPECT_THAT(*warning, HasSubstr("cluster.tls"));
    }
    EXPECT_FALSE(InsecureListenWarning(c.address, ClusterSecurity::Plaintext(), false));
  }
}

// A token other users can read, or one short enough to guess, is served
// but warned about, naming the file and what to do.
TEST_F(SecurityTest, AWeakTokenIsWarnedAbout) {
  struct Case {
    const char* name;
    const char* token;
    std::filesystem::perms perms;
    std::vector<std::string> warned;  // substrings, one per warning expected
  };
  const std::string strong(40, 'k');
  const std::vector<Case> cases = {
      {"private and long", strong.c_str(), std::filesystem::perms::owner_read, {}},
      {"world-readable", strong.c_str(),
       std::filesystem::perms::owner_read | std::filesystem::perms::group_read |
           std::filesystem::perms::others_read,
       {"chmod 600"}},
      {"three characters", "abc", std::filesystem::perms::owner_read, {"3 characters"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string token_file = absl::StrCat(*dir_, "/weak.", &c - cases.data(), ".token");
    std::ofstream(token_file) << c.token << "\n";
    std::filesystem::permissions(token_file, c.perms);
    ClusterConfig cluster = SecureCluster(false);
    cluster.mutable_auth()->set_token_file(token_file);
    absl::StatusOr<ClusterSecurity> security =
        ClusterSecurity::FromConfig(cluster, ClusterSecurity::Role::kServer);
    ASSERT_TRUE(security.ok()) << security.status();
    ASSERT_EQ(security->warnings().size(), c.warned.size());
    for (size_t i = 0; i < c.warned.size(); ++i) {
      EXPECT_THAT(security->warnings()[i], HasSubstr(c.warned[i]));
      EXPECT_THAT(security->warnings()[i], HasSubstr(token_file));
    }
  }
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer ab"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

}  // namespace
}  // namespace pst
