// Connecting to the shards, and what Init refuses before any call. Where
// the variables go is placement's (tests/placement/placement_test.cc).
#include "worker/client/ps_client.h"

#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace pst {
namespace {

// Connect needs only channels that connect: one gRPC server per shard
// serving the generated (unimplemented) service is enough.
class Shards {
 public:
  explicit Shards(int n) {
    for (int i = 0; i < n; ++i) {
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(&service_);
      servers_.push_back(builder.BuildAndStart());
      addresses_.push_back("127.0.0.1:" + std::to_string(port));
    }
  }
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  ParameterServer::Service service_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

TEST(PsClientTest, InitRefusesAModelThatLeavesAShardEmpty) {
  // One scalar cannot be cut: Init says why instead of asking a shard to
  // hold nothing.
  Shards servers(2);
  auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({{"s", {1}}});
  const std::vector<float> one = {1.0f};
  absl::StatusOr<bool> init = (*client)->Init({one});
  EXPECT_EQ(init.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("run fewer PS shards"));
}

TEST(PsClientTest, UnreachableShardIsUnavailableAndNamed) {
  auto client = PsClient::Connect({"127.0.0.1:1"}, 0, absl::Milliseconds(300));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()), ::testing::HasSubstr("ps:0 at 127.0.0.1:1"));
}

}  // namespace
}  // namespace pst
