// What the tests of rpc_limits share: small models, requests and checks.
#ifndef PST_TESTS_PS_SERVER_SERVICE_RPC_LIMITS_TESTING_H_
#define PST_TESTS_PS_SERVER_SERVICE_RPC_LIMITS_TESTING_H_

#include <chrono>
#include <climits>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "gtest/gtest.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/service/rpc_limits.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"

namespace pst::rpc_limits_testing {

// A field of /proc/self/status ("Threads", "VmRSS" in kB).
inline int64_t ProcStatus(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    std::string value = line.substr(field.size() + 1);
    value = value.substr(0, value.find(" kB"));
    int64_t number = 0;
    if (absl::SimpleAtoi(value, &number)) return number;
  }
  return -1;
}

inline std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// A shard holding `variables` (name, elements), served with `limits`; none:
// a shard still waiting for its Init.
class Served {
 public:
  Served(std::vector<std::pair<std::string, int64_t>> variables, const RpcLimits& limits,
         Mode mode = ASYNC, int workers = 2, AdminHooks hooks = {}) {
    ShardOptions options;
    options.mode = mode;
    options.num_workers = workers;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    InitRequest init;
    for (const auto& [name, elements] : variables) {
      EncodeTensor(name, std::vector<int64_t>{elements}, std::vector<float>(elements, 1.0f),
                   init.add_variables());
    }
    InitResponse initialized;
    if (!variables.empty()) {
      EXPECT_TRUE(shard_->Init(init, &initialized).ok());
    }
    auto running = StartGrpcServer("127.0.0.1:0", shard_.get(), std::move(hooks),
                                   ClusterSecurity::Plaintext(), limits);
    EXPECT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", server_.port), grpc::InsecureChannelCredentials()));
  }
  ~Served() {
    shard_->BeginShutdown();
    server_.grpc_server->Shutdown(In(absl::Seconds(2)));
  }

  ParameterServer::Stub& stub() { return *stub_; }
  ParameterShard& shard() { return *shard_; }
  int port() const { return server_.port; }
  const OpenStreams& streams() const { return server_.service->open_streams(); }
  int open_connections() { return server_.gate->open_connections(); }

  // Whether the server still answers.
  bool Alive() {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    StatsRequest request;
    StatsResponse response;
    return stub_->Stats(&context, request, &response).ok();
  }

 private:
  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

// An Init as raw bytes, sent as they are: grpc's status and the answer.
inline std::pair<grpc::Status, InitResponse> RawInit(Served* served, const std::string& bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", served->port()),
                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(20)));
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

inline PullRequest PullOf(std::vector<std::string> names) {
  PullRequest request;
  for (std::string& name : names) request.add_names(std::move(name));
  return request;
}

// A pull alone, as an exchange.
inline grpc::Status ExchangePull(Served* served, const PullRequest& request) {
  return CallExchange(&served->stub(), {PullOnly(request)}).status;
}

inline PullRequest InDType(PullRequest request, DType dtype) {
  request.set_dtype(dtype);
  return request;
}

}  // namespace pst::rpc_limits_testing

#endif  // PST_TESTS_PS_SERVER_SERVICE_RPC_LIMITS_TESTING_H_
