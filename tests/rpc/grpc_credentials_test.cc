// TLS and the cluster token over gRPC: a PS with cluster.tls and
// cluster.auth serves only clients that trust its CA, present the token and,
// under mutual TLS, a certificate of its CA. Certificates come from openssl,
// made per run.
#include "rpc/grpc_credentials.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps.grpc.pb.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/ps_service.h"
#include "tests/support/secure_cluster_test.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr char kTokenEnv[] = "PST_GRPC_CREDENTIALS_TEST_TOKEN";

class GrpcCredentialsTest : public SecureClusterTest {
 protected:
  GrpcCredentialsTest() : SecureClusterTest(kTokenEnv) {}

  void TearDown() override {
    for (auto& server : servers_) server.grpc_server->Shutdown();
    for (auto& shard : shards_) shard->BeginShutdown();
    SecureClusterTest::TearDown();
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
    ConfigureChannel(*security, &args);
    auto stub = ParameterServer::NewStub(
        grpc::CreateCustomChannel(address, ChannelCredentials(*security), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    StatsRequest request;
    StatsResponse response;
    return stub->Stats(&context, request, &response);
  }

  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::vector<RunningServer> servers_;
};

TEST_F(GrpcCredentialsTest, TheRightTokenOverTlsIsServed) {
  std::string address = StartServer(SecureCluster(false));
  grpc::Status status = CallStats(address, SecureCluster(false));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(GrpcCredentialsTest, AMissingOrWrongTokenIsUnauthenticated) {
  std::string address = StartServer(SecureCluster(false));
  ClusterConfig no_token = SecureCluster(false);
  no_token.clear_auth();
  grpc::Status missing = CallStats(address, no_token);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("carried none"));

  std::string token_file = dir() + "/wrong.token";
  std::ofstream(token_file) << "s3cret-tokeN\n";
  ClusterConfig wrong_token = SecureCluster(false);
  wrong_token.mutable_auth()->Clear();
  wrong_token.mutable_auth()->set_token_file(token_file);
  grpc::Status wrong = CallStats(address, wrong_token);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.error_message(), HasSubstr("does not match"));
}

TEST_F(GrpcCredentialsTest, ATokenFileServesLikeTheEnvironment) {
  std::string token_file = dir() + "/right.token";
  std::ofstream(token_file) << "  s3cret-token\n";  // whitespace around it is not part of it
  ClusterConfig from_file = SecureCluster(false);
  from_file.mutable_auth()->Clear();
  from_file.mutable_auth()->set_token_file(token_file);
  std::string address = StartServer(SecureCluster(false));
  grpc::Status status = CallStats(address, from_file);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// With cluster.auth a worker carries its own task's token
// (PSTRAIN_TASK_TOKEN, made from the cluster token): it acts as that worker
// and no other, and may not shut the PS down; a token made from another
// cluster token is not let in at all.
TEST_F(GrpcCredentialsTest, ATaskTokenActsAsItsTaskOnly) {
  std::string address = StartServer(SecureCluster(false));
  const auto stub_with = [&](const std::string& task_token) {
    setenv(kTaskTokenEnv, task_token.c_str(), 1);
    absl::StatusOr<ClusterSecurity> security =
        ClusterSecurity::FromConfig(SecureCluster(false), ClusterSecurity::Role::kClient);
    unsetenv(kTaskTokenEnv);
    EXPECT_TRUE(security.ok()) << security.status();
    grpc::ChannelArguments args;
    ConfigureChannel(*security, &args);
    return ParameterServer::NewStub(
        grpc::CreateCustomChannel(address, ChannelCredentials(*security), args));
  };
  const auto register_as = [](ParameterServer::Stub* stub, int worker) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    RegisterRequest request;
    request.set_worker(worker);
    RegisterResponse response;
    return stub->Register(&context, request, &response);
  };
  auto worker0 = stub_with(TaskToken("s3cret-token", "worker:0"));
  const grpc::Status as_itself = register_as(worker0.get(), 0);
  EXPECT_TRUE(as_itself.ok()) << as_itself.error_message();
  const grpc::Status as_other = register_as(worker0.get(), 1);
  EXPECT_EQ(as_other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(as_other.error_message(), HasSubstr("worker:0's task token"));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ShutdownResponse response;
    EXPECT_EQ(worker0->Shutdown(&context, ShutdownRequest(), &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  auto forged = stub_with(TaskToken("another-cluster-token", "worker:0"));
  EXPECT_EQ(register_as(forged.get(), 0).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The cluster token acts as any worker.
  EXPECT_TRUE(CallStats(address, SecureCluster(false)).ok());
}

TEST_F(GrpcCredentialsTest, APlaintextClientCannotTalkToATlsServer) {
  std::string address = StartServer(SecureCluster(false));
  grpc::Status status = CallStats(address, ClusterConfig());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(GrpcCredentialsTest, AClientThatDoesNotTrustTheServerCaFails) {
  std::string address = StartServer(SecureCluster(false));
  ClusterConfig other_ca = SecureCluster(false);
  other_ca.mutable_tls()->set_ca(certs().other_ca);
  grpc::Status status = CallStats(address, other_ca);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(GrpcCredentialsTest, MutualTlsRejectsClientCertificatesOfAnotherCa) {
  std::string address = StartServer(SecureCluster(true));
  grpc::Status good = CallStats(address, SecureCluster(true));
  EXPECT_TRUE(good.ok()) << good.error_message();

  // The client trusts the server, but its own certificate is signed by a CA
  // the server does not know.
  ClusterConfig foreign = SecureCluster(true);
  foreign.mutable_tls()->set_cert(certs().other_cert);
  foreign.mutable_tls()->set_key(certs().other_key);
  grpc::Status status = CallStats(address, foreign);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();

  // No client certificate at all.
  ClusterConfig anonymous = SecureCluster(false);
  grpc::Status none = CallStats(address, anonymous);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAVAILABLE) << none.error_message();
}

}  // namespace PST_FILE_ID
}  // namespace pst
