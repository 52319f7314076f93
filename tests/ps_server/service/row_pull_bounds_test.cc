// Pulls of embedding rows against a real shard behind gRPC on 127.0.0.1:
// bounded in ids and in answer bytes from the request's sizes, before any
// row is looked at. (Their memory: tests/ps_server/row_pull_memory_test.cc.)
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/service/ps_service.h"
#include "tests/support/exchange_calls.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr int kDim = 4;

// Shard 0 of `num_shards` holding the table "emb" (kDim), served with
// `limits`.
class RowPullBoundsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (shard_ == nullptr) return;
    shard_->BeginShutdown();
    server_.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  void Start(int num_shards, const RpcLimits& limits) {
    ShardOptions options;
    options.mode = ASYNC;
    options.num_workers = 1;
    options.num_shards = num_shards;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    InitRequest init;
    EmbeddingTableConfig* table = init.add_embeddings();
    table->set_name("emb");
    table->set_dim(kDim);
    InitResponse initialized;
    ASSERT_TRUE(shard_->Init(init, &initialized).ok());
    absl::StatusOr<RunningServer> running = StartGrpcServer(
        "127.0.0.1:0", shard_.get(), AdminHooks{}, ClusterSecurity::Plaintext(), limits);
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                         grpc::InsecureChannelCredentials()));
  }

  // `count` ids that shard `shard` of `num_shards` holds.
  static std::vector<uint64_t> IdsOf(int shard, int num_shards, int64_t count) {
    std::vector<uint64_t> ids;
    for (uint64_t id = 1; static_cast<int64_t>(ids.size()) < count; ++id) {
      if (ShardOfRow(id, num_shards) == shard) ids.push_back(id);
    }
    return ids;
  }

  ExchangeOutcome PullRows(const std::vector<uint64_t>& ids) {
    PullRequest pull;
    EmbeddingRows* rows = pull.add_rows();
    rows->set_table("emb");
    rows->set_ids(std::string(reinterpret_cast<const char*>(ids.data()),
                              ids.size() * sizeof(uint64_t)));
    return CallExchange(stub_.get(), {PullOnly(pull)});
  }

  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

// Third hostile pass: a 20 M-id pull burned about 8 s of the shard's CPU
// checking every id before its answer was found too large. The bounds are
// checked first: a pull of ids that all belong to another shard (which the
// row check would refuse, id by id) is refused for its size instead.
TEST_F(RowPullBoundsTest, APullIsBoundedInIdsAndAnswerBytesBeforeAnyRowIsLookedAt) {
  Start(/*num_shards=*/2, RpcLimits{.max_rows_per_pull = 1000, .max_reply_bytes = 8000});
  const std::vector<uint64_t> others = IdsOf(1, 2, 1001);
  ExchangeOutcome outcome = PullRows(others);
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(outcome.status.error_message(), HasSubstr("--max_rows_per_pull"));
  // 1000 rows of 4 float32 take 16 000 bytes, over the answer's 8 000.
  outcome = PullRows(std::vector<uint64_t>(others.begin(), others.begin() + 1000));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(outcome.status.error_message(), HasSubstr("--max_reply_bytes"));
  // Within both bounds, the rows are looked at: another shard's are refused.
  outcome = PullRows(std::vector<uint64_t>(others.begin(), others.begin() + 100));
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  outcome = PullRows(IdsOf(0, 2, 100));
  EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
}

}  // namespace PST_FILE_ID
}  // namespace pst
