// What the tests of shm_exchange share: small models, requests and checks.
#ifndef PST_TESTS_PS_SERVER_SERVICE_SHM_EXCHANGE_TESTING_H_
#define PST_TESTS_PS_SERVER_SERVICE_SHM_EXCHANGE_TESTING_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/region_handoff.h"
#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/support/thread_count.h"

namespace pst::shm_testing {

using ::testing::Each;
using ::testing::Eq;

inline constexpr int64_t kElements = 1000;
inline constexpr int64_t kBytes = kElements * sizeof(float);

class ShmExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(/*shared_memory=*/true); }

  // A shard of `variables` (name and elements; every value 1), "w" of
  // kElements by default, learning rate 1.
  void Start(bool shared_memory, Mode mode = ASYNC,
             const std::vector<std::pair<std::string, int64_t>>& variables = {{"w", kElements}}) {
    ShardOptions options;
    options.mode = mode;
    options.num_workers = 2;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
    ASSERT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    InitRequest init;
    for (const auto& [name, elements] : variables) {
      EncodeTensor(name, std::vector<int64_t>{elements}, std::vector<float>(elements, 1.0f),
                   init.add_variables());
    }
    InitResponse init_response;
    ASSERT_TRUE(shard_->Init(init, &init_response).ok());
    absl::StatusOr<RunningServer> server =
        StartGrpcServer("127.0.0.1:0", shard_.get(), AdminHooks{}, ClusterSecurity::Plaintext(),
                        RpcLimits{}, shared_memory);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                         grpc::InsecureChannelCredentials()));
  }

  void TearDown() override { server_.grpc_server->Shutdown(); }

  void Restart(Mode mode,
               const std::vector<std::pair<std::string, int64_t>>& variables = {{"w", kElements}}) {
    server_.grpc_server->Shutdown();
    Start(/*shared_memory=*/true, mode, variables);
  }

  grpc::Status Attach(SharedRegion& region, int worker, uint64_t* handle,
                      std::string boot_id = "") {
    return AttachRegion(stub_.get(), worker, region, handle, boot_id);
  }

  // A push of "w" from `push_offset` and its answer at `answer_offset`.
  static ExchangeChunk PushPull(uint64_t handle, int64_t push_offset, int64_t answer_offset,
                                int64_t elements = kElements) {
    ExchangeChunk request;
    request.mutable_shm()->set_region(handle);
    request.mutable_header()->set_worker(0);
    Tensor* gradient = request.mutable_header()->add_gradients();
    gradient->set_name("w");
    gradient->add_shape(elements);
    gradient->set_dtype(FLOAT32);
    request.mutable_shm()->set_push_offset(push_offset);
    request.mutable_pull();
    request.mutable_shm()->set_answer_offset(answer_offset);
    return request;
  }

  // The exchange of one message `request`; `response` gets its answer.
  grpc::Status Exchange(const ExchangeChunk& request, ExchangeOutcome* response) {
    *response = CallExchange(stub_.get(), {request});
    return response->status;
  }

  // The model's values and version.
  std::vector<float> Model(int64_t* version) {
    PullRequest pull;
    PullResponse response;
    EXPECT_TRUE(Pull(*shard_, pull, absl::Now(), &response).ok());
    *version = response.version();
    std::vector<float> values(kElements);
    DecodeTensor(response.variables(0), values);
    return values;
  }

  void ExpectModelUntouched() {
    int64_t version = -1;
    EXPECT_THAT(Model(&version), Each(Eq(1.0f)));
    EXPECT_EQ(version, 0);
  }

  static std::unique_ptr<SharedRegion> NewRegion(
      int64_t bytes = 2 * kBytes, SharedRegion::Kind kind = SharedRegion::Kind::kSealed) {
    absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(bytes, kind);
    EXPECT_TRUE(region.ok()) << region.status();
    return std::move(*region);
  }

  static void Fill(const SharedRegion& region, int64_t offset, float value) {
    std::vector<float> values(kElements, value);
    std::memcpy(region.bytes().data() + offset, values.data(), kBytes);
  }

  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

}  // namespace pst::shm_testing

#endif  // PST_TESTS_PS_SERVER_SERVICE_SHM_EXCHANGE_TESTING_H_
