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
// `service`, if given, answers instead; `max_receive_bytes`, if given, is
// the servers' limit on a message.
class Shards {
 public:
  explicit Shards(int n, ParameterServer::Service* service = nullptr,
                  int max_receive_bytes = -1) {
    for (int i = 0; i < n; ++i) {
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(service != nullptr ? service : &service_);
      if (max_receive_bytes >= 0) builder.SetMaxReceiveMessageSize(max_receive_bytes);
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

// Init's RESOURCE_EXHAUSTED is the share's size only when gRPC refused the
// message for it; any other is the shard's own answer, passed on.
TEST(PsClientTest, AnInitOverTheShardsMessageLimitIsSaidToBeTooLarge) {
  Shards servers(1, nullptr, /*max_receive_bytes=*/64);
  auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({{"w", {100}}});
  const std::vector<float> values(100, 1.0f);
  absl::StatusOr<bool> init = (*client)->Init({values});
  EXPECT_EQ(init.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("more than it accepts in one request"));
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("--max_message_bytes"));
}

class BusyShard : public ParameterServer::Service {
 public:
  grpc::Status Init(grpc::ServerContext*, const InitRequest*, InitResponse*) override {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "Inits of 900 bytes wait to be checked, the most this PS holds; try again");
  }
};

TEST(PsClientTest, AShardsOwnResourceRefusalOfInitIsPassedOnAsItsOwn) {
  BusyShard busy;
  Shards servers(1, &busy);
  auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({{"w", {100}}});
  const std::vector<float> values(100, 1.0f);
  absl::StatusOr<bool> init = (*client)->Init({values});
  EXPECT_EQ(init.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("ps:0 ("));
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("wait to be checked"));
  EXPECT_THAT(init.status().message(),
              ::testing::Not(::testing::HasSubstr("more than it accepts in one request")));
  EXPECT_TRUE(NamesItsShard(init.status()));
}

TEST(PsClientTest, UnreachableShardIsUnavailableAndNamed) {
  auto client = PsClient::Connect({"127.0.0.1:1"}, 0, absl::Milliseconds(300));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()), ::testing::HasSubstr("ps:0 at 127.0.0.1:1"));
}

}  // namespace
}  // namespace pst
