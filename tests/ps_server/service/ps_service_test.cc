// The gRPC face of a shard: requests over the configured size are refused by
// gRPC before the handler runs, and leave the model as it was; a second
// server cannot take a port a shard already serves.
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/support/exchange_calls.h"

namespace pst {
namespace PST_FILE_ID {

struct SizeCase {
  std::string name;
  int max_request_bytes;
  int64_t elements;  // of the one variable "w"; a push carries 4 bytes each
  bool accepted;
};
void PrintTo(const SizeCase& c, std::ostream* os) { *os << c.name; }

class MaxRequestBytesTest : public ::testing::TestWithParam<SizeCase> {};

std::vector<float> Values(ParameterShard* shard, int64_t* version) {
  PullRequest pull;
  PullResponse response;
  EXPECT_TRUE(Pull(*shard, pull, absl::Now(), &response).ok());
  *version = response.version();
  std::vector<float> values(response.variables(0).data().size() / sizeof(float));
  DecodeTensor(response.variables(0), values);
  return values;
}

// Without this, gRPC's default SO_REUSEPORT lets a second ps_server for the
// same shard start beside the first, and the kernel splits the workers'
// connections between the two.
TEST(StartGrpcServerTest, ASecondServerCannotTakeAPortInUse) {
  ShardOptions options;
  options.num_workers = 1;
  options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
  absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
  ASSERT_TRUE(shard.ok()) << shard.status();
  absl::StatusOr<RunningServer> first = StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", first->port);
  absl::StatusOr<RunningServer> second = StartGrpcServer(address, shard->get(), AdminHooks{});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("port in use"), std::string::npos)
      << second.status();
  first->grpc_server->Shutdown();
}

TEST_P(MaxRequestBytesTest, RefusesOversizedPushAndLeavesModelUntouched) {
  const SizeCase& c = GetParam();
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
  absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::vector<int64_t> shape = {c.elements};
  InitRequest init;
  EncodeTensor("w", shape, std::vector<float>(c.elements, 1.0f), init.add_variables());
  InitResponse init_response;
  ASSERT_TRUE((*shard)->Init(init, &init_response).ok());

  absl::StatusOr<RunningServer> server =
      StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{}, ClusterSecurity::Plaintext(),
                      RpcLimits{.max_request_bytes = c.max_request_bytes});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = ParameterServer::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", server->port), grpc::InsecureChannelCredentials()));

  PushRequest push;
  push.set_worker(0);
  push.set_computed_at_version(0);
  EncodeTensor("w", shape, std::vector<float>(c.elements, 0.5f), push.add_gradients());
  // The whole push in one message, as a worker sends a share of at most
  // one chunk.
  const ExchangeOutcome outcome = CallExchange(stub.get(), {WholePush(push)}, absl::Seconds(60));
  const grpc::Status& status = outcome.status;

  int64_t version = -1;
  std::vector<float> values = Values(shard->get(), &version);
  StatsResponse stats;
  (*shard)->Stats(&stats);
  if (c.accepted) {
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_NE(outcome.done(), nullptr);
    EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
    EXPECT_EQ(version, 1);
    EXPECT_EQ(values, std::vector<float>(c.elements, 0.5f));
  } else {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_EQ(version, 0);
    EXPECT_EQ(values, std::vector<float>(c.elements, 1.0f));
    EXPECT_EQ(stats.pushes_rejected(), 0) << "the handler must not even have seen it";
  }
  (*shard)->BeginShutdown();
  server->grpc_server->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, MaxRequestBytesTest,
    ::testing::Values(
        // 64 KiB of gradient against a 32 KiB limit.
        SizeCase{"OverTheLimit", 32 << 10, 16 << 10, false},
        SizeCase{"UnderTheLimit", 1 << 20, 16 << 10, true},
        // 6 MiB: past gRPC's own 4 MiB default, well within ours.
        SizeCase{"DefaultLimitAcceptsLargeModels", kDefaultMaxRequestBytes, 1536 << 10, true}),
    [](const ::testing::TestParamInfo<SizeCase>& info) { return info.param.name; });

}  // namespace PST_FILE_ID
}  // namespace pst
