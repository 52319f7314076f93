// Inits sent to a shard still waiting for its model, by a client that is
// not a worker: each one that waits to be parsed holds its bytes, so one
// larger than the config's share is refused unparsed.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "ps_server/service/ps_service.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// An Init as raw bytes: gRPC's status and the answer.
std::pair<grpc::Status, InitResponse> RawInit(int port, const std::string& bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::Slice payload(bytes);
  grpc::ByteBuffer request(&payload, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/pst.ParameterServer/Init", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status call_status) {
                   status = std::move(call_status);
                   done.Notify();
                 });
  done.WaitForNotification();
  InitResponse answer;
  if (status.ok()) {
    EXPECT_TRUE(grpc::SerializationTraits<InitResponse>::Deserialize(&response, &answer).ok());
  }
  return {status, answer};
}

std::string InitOf(int worker, const std::string& name, int64_t elements) {
  InitRequest init;
  init.set_worker(worker);
  EncodeTensor(name, std::vector<int64_t>{elements}, std::vector<float>(elements, 1.0f),
               init.add_variables());
  return init.SerializeAsString();
}

TEST(InitFloodTest, AnInitLargerThanTheConfigsShareIsRefusedUnparsed) {
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = 2;
  options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
  ConfigModel model;
  model.variables = {{"w", {16}}};
  options.model = model;
  std::unique_ptr<ParameterShard> shard = std::move(*ParameterShard::Create(options));
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1:0", shard.get(), {});
  ASSERT_TRUE(server.ok()) << server.status();

  // 8 MB where the share is 64 bytes of values.
  const auto [refused, unused] = RawInit(server->port, InitOf(1, "w", 2 << 20));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("cannot be this shard's share of the config's model (training.model)"));
  EXPECT_THAT(refused.error_message(), HasSubstr("it was not parsed"));
  EXPECT_FALSE(shard->initialized());

  // The share itself, and one of its size that is not it, are still parsed
  // and judged by what they carry.
  const auto [other, unused_other] = RawInit(server->port, InitOf(1, "v", 16));
  EXPECT_EQ(other.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(other.error_message(), HasSubstr("does not carry shard 0's share"));
  const auto [accepted, answer] = RawInit(server->port, InitOf(0, "w", 16));
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_TRUE(answer.accepted());
  shard->BeginShutdown();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

}  // namespace PST_FILE_ID
}  // namespace pst
