// Connecting to the shards, and what Init refuses before any call. Where
// the variables go is placement's (tests/placement/placement_test.cc).
#include "worker/client/ps_client.h"

#include <atomic>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "ps.grpc.pb.h"
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"

namespace pst {
namespace PST_FILE_ID {

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
// message for it (no overload mark); a marked one is the shard's own
// answer, passed on.
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
    // A shard's own refusal for now carries its mark (common/transient_refusal.h).
    return ToGrpcStatus(MarkTransient(
        absl::ResourceExhaustedError(
            "Inits of 900 bytes wait to be checked, the most this PS holds; try again"),
        TransientRefusal::kOverloaded));
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

// A shard that refuses the first `refusals` calls of Init, Done and
// AwaitWorkersDone for now (RESOURCE_EXHAUSTED, then UNAVAILABLE), and
// answers after.
class RefusesForNow : public ParameterServer::Service {
 public:
  explicit RefusesForNow(int refusals) : refusals_(refusals) {}
  grpc::Status Init(grpc::ServerContext*, const InitRequest*, InitResponse* response) override {
    response->set_accepted(true);
    return Answer();
  }
  grpc::Status Done(grpc::ServerContext*, const DoneRequest*, DoneResponse*) override {
    return Answer();
  }
  grpc::Status AwaitWorkersDone(grpc::ServerContext*, const AwaitWorkersDoneRequest* request,
                                StatsResponse* response) override {
    if (!request->has_worker() || request->worker() != 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the wait names no worker");
    }
    response->set_workers_done(1);
    return Answer();
  }
  int calls() const { return calls_.load(); }

 private:
  grpc::Status Answer() {
    const int call = calls_.fetch_add(1);
    if (call >= refusals_) return grpc::Status::OK;
    return ToGrpcStatus(MarkTransient(
        absl::Status(call % 2 == 0 ? absl::StatusCode::kResourceExhausted
                                   : absl::StatusCode::kUnavailable,
                     "this PS already has 64 calls waiting; try again later"),
        TransientRefusal::kOverloaded));
  }
  const int refusals_;
  std::atomic<int> calls_{0};
};

// Third hostile pass: a refusal of the chief's AwaitWorkersDone ended the
// job. A worker's Init, Done and AwaitWorkersDone wait out refusals for
// now within the client's patience, and fail at the first without it.
TEST(PsClientTest, UnaryCallsWaitOutRefusalsForNowWithinThePatience) {
  using Call = std::function<absl::Status(PsClient&)>;
  const std::vector<std::pair<std::string, Call>> calls = {
      {"Init",
       [](PsClient& c) {
         const std::vector<float> values(4, 1.0f);
         return c.Init({values}).status();
       }},
      {"Done", [](PsClient& c) { return c.Done(); }},
      {"AwaitWorkersDone",
       [](PsClient& c) { return c.AwaitWorkersDone(0, -1, absl::ZeroDuration()).status(); }},
  };
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    {
      RefusesForNow shard(3);
      Shards servers(1, &shard);
      auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
      ASSERT_TRUE(client.ok()) << client.status();
      (*client)->SetVariables({{"w", {4}}});
      (*client)->set_call_patience(absl::Seconds(30));
      EXPECT_TRUE(call(**client).ok());
      EXPECT_EQ(shard.calls(), 4);
    }
    RefusesForNow shard(3);
    Shards servers(1, &shard);
    auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables({{"w", {4}}});
    EXPECT_EQ(call(**client).code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(shard.calls(), 1);
  }
}

TEST(PsClientTest, UnreachableShardIsUnavailableAndNamed) {
  auto client = PsClient::Connect({"127.0.0.1:1"}, 0, absl::Milliseconds(300));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()), ::testing::HasSubstr("ps:0 at 127.0.0.1:1"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
