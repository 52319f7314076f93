// What the tests of embedding rows through the Exchange share: a shard of
// one dense variable and one table behind gRPC, and its requests.
#ifndef PST_TESTS_PS_SERVER_SERVICE_EXCHANGE_ROWS_TESTING_H_
#define PST_TESTS_PS_SERVER_SERVICE_EXCHANGE_ROWS_TESTING_H_

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/service/ps_service.h"
#include "tests/support/exchange_calls.h"

namespace pst::rows_testing {

// Embedding rows through the Exchange: the push's row gradients inline in
// the request's header, the pulled rows inline in the answer's header,
// over TCP and through a shared region alike.
class ExchangeRowsTest : public ::testing::Test {
 protected:
  static constexpr int kDim = 4;
  static constexpr int64_t kDense = 8;  // elements of "w"

  void TearDown() override {
    if (shard_ == nullptr) return;
    shard_->BeginShutdown();
    server_.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // Shard 0 of `num_shards`, two workers, learning rate 1, holding "w"
  // (kDense values 1) and the table "emb" (kDim); shared memory on.
  void Start(Mode mode, int num_shards = 1, const RpcLimits& limits = {}) {
    ShardOptions options;
    options.mode = mode;
    options.num_workers = 2;
    options.num_shards = num_shards;
    options.seed = 3;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    InitRequest init;
    EncodeTensor("w", std::vector<int64_t>{kDense}, std::vector<float>(kDense, 1.0f),
                 init.add_variables());
    EmbeddingTableConfig* table = init.add_embeddings();
    table->set_name("emb");
    table->set_dim(kDim);
    InitResponse initialized;
    ASSERT_TRUE(shard_->Init(init, &initialized).ok());
    absl::StatusOr<RunningServer> running =
        StartGrpcServer("127.0.0.1:0", shard_.get(), AdminHooks{}, ClusterSecurity::Plaintext(),
                        limits, /*shared_memory=*/true);
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_.port),
                                                         grpc::InsecureChannelCredentials()));
  }

  static std::string IdBytes(const std::vector<uint64_t>& ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t));
  }
  // Rows of "emb": `ids`, with float32 gradients `values` (none in a pull).
  static EmbeddingRows Rows(const std::vector<uint64_t>& ids,
                            const std::vector<float>& values = {}) {
    EmbeddingRows rows;
    rows.set_table("emb");
    rows.set_ids(IdBytes(ids));
    rows.set_dtype(FLOAT32);
    rows.set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    return rows;
  }

  // The shard's own answer for rows `ids` and "w", without the network.
  PullResponse ShardPull(const std::vector<uint64_t>& ids) {
    PullRequest pull;
    pull.add_names("w");
    *pull.add_rows() = Rows(ids);
    PullResponse response;
    const absl::Status status = Pull(*shard_, pull, absl::Now(), &response);
    EXPECT_TRUE(status.ok()) << status;
    return response;
  }
  static std::vector<float> Floats(const std::string& bytes) {
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    return values;
  }

  // An exchange by `worker` pushing "w" (every gradient value 0.5) and
  // `pushed` rows of "emb" (every value `g`) at the shard's version, and
  // pulling "w" and rows `pulled` at `min_version`: over TCP, or through
  // region `handle` (the gradient at 0, the answer after it).
  ExchangeChunk PushAndPull(int worker, const std::vector<uint64_t>& pushed, float g,
                            const std::vector<uint64_t>& pulled, int64_t min_version,
                            uint64_t handle = 0, bool dense = true) {
    ExchangeChunk chunk;
    PushRequest* header = chunk.mutable_header();
    header->set_worker(worker);
    header->set_computed_at_version(shard_->version());
    if (dense) {
      Tensor* gradient = header->add_gradients();
      gradient->set_name("w");
      gradient->set_dtype(FLOAT32);
      gradient->add_shape(kDense);
    }
    if (!pushed.empty()) {
      *header->add_rows() = Rows(pushed, std::vector<float>(pushed.size() * kDim, g));
    }
    PullRequest* pull = chunk.mutable_pull();
    pull->set_min_version(min_version);
    pull->set_timeout_ms(60000);
    if (!pulled.empty()) *pull->add_rows() = Rows(pulled);
    if (handle != 0) {
      chunk.mutable_shm()->set_region(handle);
      chunk.mutable_shm()->set_push_offset(0);
      chunk.mutable_shm()->set_answer_offset(kDense * sizeof(float));
    } else if (dense) {
      const std::vector<float> gradient(kDense, 0.5f);
      TensorPiece* piece = chunk.add_pieces();
      piece->set_tensor(0);
      piece->set_data(reinterpret_cast<const char*>(gradient.data()), kDense * sizeof(float));
    }
    return chunk;
  }

  // Stops the shard and its server, for a test that starts another.
  void Stop() {
    TearDown();
    stub_.reset();
    shard_.reset();
  }

  // `chunk` with the rows of its header and pull moved into `region` from
  // `at` (ShmTransfer.push_rows, pull_rows), as a worker whose shard reads
  // them there sends it; the answer's rows go after them.
  static ExchangeChunk RowsInRegion(ExchangeChunk chunk, const SharedRegion& region, int64_t at) {
    ShmTransfer* transfer = chunk.mutable_shm();
    auto put = [&](std::string* bytes) {
      const int64_t offset = at;
      std::memcpy(region.bytes().data() + at, bytes->data(), bytes->size());
      at += static_cast<int64_t>(bytes->size());
      bytes->clear();
      return offset;
    };
    for (EmbeddingRows& rows : *chunk.mutable_header()->mutable_rows()) {
      ShmRows* place = transfer->add_push_rows();
      place->set_ids_bytes(static_cast<int64_t>(rows.ids().size()));
      place->set_ids_offset(put(rows.mutable_ids()));
      place->set_data_bytes(static_cast<int64_t>(rows.data().size()));
      place->set_data_offset(put(rows.mutable_data()));
    }
    for (EmbeddingRows& rows : *chunk.mutable_pull()->mutable_rows()) {
      ShmRows* place = transfer->add_pull_rows();
      place->set_ids_bytes(static_cast<int64_t>(rows.ids().size()));
      place->set_ids_offset(put(rows.mutable_ids()));
    }
    transfer->set_rows_answer_offset(at);
    return chunk;
  }

  // A region attached by `worker` holding the gradient of "w" (0.5) at 0.
  std::unique_ptr<SharedRegion> AttachRegion(int worker, uint64_t* handle) {
    return AttachFilledRegion(stub_.get(), worker, 1 << 16, kDense, 0.5f, handle);
  }

  // The answer's rows of "emb" as floats (from its header), checking that
  // it has exactly one table's.
  static std::vector<float> AnsweredRows(const ExchangeOutcome& outcome) {
    EXPECT_FALSE(outcome.answers.empty());
    if (outcome.answers.empty()) return {};
    const PullResponse& header = outcome.answers[0].header();
    EXPECT_EQ(header.rows_size(), 1);
    if (header.rows_size() != 1) return {};
    EXPECT_EQ(header.rows(0).table(), "emb");
    EXPECT_EQ(header.rows(0).dtype(), FLOAT32);
    return Floats(header.rows(0).data());
  }

  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

}  // namespace pst::rows_testing

#endif  // PST_TESTS_PS_SERVER_SERVICE_EXCHANGE_ROWS_TESTING_H_
