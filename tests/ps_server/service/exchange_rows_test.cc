// Embedding rows through the Exchange (ps_server/service/exchange_call.h), against a
// real shard behind gRPC on 127.0.0.1: pushed and pulled in one exchange
// over TCP and through a shared region, a SYNC exchange answered with the
// next step's rows once its step lands, and hostile rows refused with the
// model untouched.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/service/ps_service.h"
#include "tests/ps_server/service/exchange_rows_testing.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

using rows_testing::ExchangeRowsTest;

TEST_F(ExchangeRowsTest, RowsArePushedAndPulledInOneExchangeOverTcpAndASharedRegion) {
  Start(ASYNC);
  uint64_t handle = 0;
  std::unique_ptr<SharedRegion> region = AttachRegion(0, &handle);
  const std::vector<float> initial = Floats(ShardPull({1, 2, 3}).rows(0).data());
  int64_t version = 0;
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared region" : "TCP");
    const std::vector<float> before = Floats(ShardPull({1, 2, 3}).rows(0).data());
    const ExchangeOutcome outcome = CallExchange(
        stub_.get(), {PushAndPull(0, {1, 2}, 0.25f, {2, 3}, 0, shared ? handle : 0)});
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    ASSERT_NE(outcome.done(), nullptr);
    EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
    EXPECT_EQ(outcome.done()->version(), ++version);
    // The answer holds the committed rows 2 and 3, as the shard has them.
    const PullResponse expected = ShardPull({2, 3});
    EXPECT_EQ(AnsweredRows(outcome), Floats(expected.rows(0).data()));
    const std::vector<float> after = Floats(ShardPull({1, 2, 3}).rows(0).data());
    for (int k = 0; k < 2 * kDim; ++k) EXPECT_FLOAT_EQ(after[k], before[k] - 0.25f);
    for (int k = 2 * kDim; k < 3 * kDim; ++k) EXPECT_EQ(after[k], initial[k]);  // untouched
    // The dense answer travels as ever: in pieces, or in the region.
    std::vector<float> w(kDense);
    if (shared) {
      std::memcpy(w.data(), region->bytes().data() + kDense * sizeof(float),
                  sizeof(float) * kDense);
    } else {
      w = Floats(AnswerBytes(outcome.answers, 0));
    }
    EXPECT_EQ(w, Floats(expected.variables(0).data()));
  }
  // A dense push that streams into the update (ASYNC, no rows) still
  // answers the rows its pull names, once committed.
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "streamed, shared region" : "streamed, TCP");
    const ExchangeOutcome outcome =
        CallExchange(stub_.get(), {PushAndPull(0, {}, 0, {3, 2}, 0, shared ? handle : 0)});
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
    const PullResponse expected = ShardPull({3, 2});
    EXPECT_EQ(AnsweredRows(outcome), Floats(expected.rows(0).data()));
    EXPECT_EQ(outcome.done()->version(), expected.version());
  }
  // A push of rows alone, and a pull of rows alone, through the region.
  const ExchangeOutcome rows_only = CallExchange(
      stub_.get(), {PushAndPull(0, {7}, 1.0f, {7}, 0, handle, /*dense=*/false)});
  ASSERT_TRUE(rows_only.status.ok()) << rows_only.status.error_message();
  EXPECT_EQ(rows_only.done()->push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(rows_only.answers[0].header().variables_size(), 0);  // no variable was pushed
  EXPECT_EQ(AnsweredRows(rows_only), Floats(ShardPull({7}).rows(0).data()));
  PullRequest pull;
  *pull.add_rows() = Rows({7, 1});
  pull.add_names("w");
  const ExchangeOutcome pulled = CallExchange(stub_.get(), {PullOnly(pull)});
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  EXPECT_EQ(AnsweredRows(pulled), Floats(ShardPull({7, 1}).rows(0).data()));
  EXPECT_TRUE(Eventually([&] { return server_.service->open_streams().open() == 0; }));
}

// One round trip per SYNC step: each worker's exchange pushes step 0's rows
// and names step 1's ids, and is answered once the step has landed.
TEST_F(ExchangeRowsTest, ASyncExchangeIsAnsweredWithTheNextStepsRowsOnceTheStepLands) {
  Start(SYNC);
  const std::vector<float> initial = Floats(ShardPull({1, 2, 5}).rows(0).data());
  ExchangeOutcome first;
  std::thread worker0([&] {
    first = CallExchange(stub_.get(), {PushAndPull(0, {1, 2}, 1.0f, {2, 5}, 1)});
  });
  ASSERT_TRUE(Eventually([&] { return shard_->waiting_pulls() == 1; }))
      << "worker 0's pull never waited for the step";
  const ExchangeOutcome second =
      CallExchange(stub_.get(), {PushAndPull(1, {2}, 3.0f, {2, 5}, 1)});
  worker0.join();
  for (const ExchangeOutcome* outcome : std::vector<const ExchangeOutcome*>{&first, &second}) {
    ASSERT_TRUE(outcome->status.ok()) << outcome->status.error_message();
    EXPECT_EQ(outcome->done()->version(), 1);
    const std::vector<float> rows = AnsweredRows(*outcome);
    ASSERT_EQ(rows.size(), 2u * kDim);
    for (int k = 0; k < kDim; ++k) {
      // Row 2: the mean of 1 and 3 over both workers; row 5 untouched.
      EXPECT_FLOAT_EQ(rows[k], initial[kDim + k] - 2.0f);
      EXPECT_EQ(rows[kDim + k], initial[2 * kDim + k]);
    }
  }
  EXPECT_EQ(first.done()->push().outcome(), PushResponse::AGGREGATED);
  EXPECT_EQ(second.done()->push().outcome(), PushResponse::APPLIED);
  // Row 1: worker 0's 1 over two workers.
  const std::vector<float> one = Floats(ShardPull({1}).rows(0).data());
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(one[k], initial[k] - 0.5f);
  EXPECT_EQ(shard_->version(), 1);
}

// Refused before anything is applied or encoded, whatever the path.
TEST_F(ExchangeRowsTest, HostileRowsAreRefusedWithTheirCodeAndTheModelUntouched) {
  RpcLimits limits;
  limits.max_reply_bytes = 4096;
  Start(ASYNC, /*num_shards=*/2, limits);
  uint64_t handle = 0;
  std::unique_ptr<SharedRegion> region = AttachRegion(0, &handle);
  uint64_t theirs = 0, mine = 0;
  while (ShardOfRow(theirs, 2) != 1) ++theirs;
  while (ShardOfRow(mine, 2) != 0) ++mine;
  std::vector<uint64_t> many;  // 1000 rows of 16 bytes: past 4096 bytes
  for (uint64_t id = 0; many.size() < 1000; ++id) {
    if (ShardOfRow(id, 2) == 0) many.push_back(id);
  }
  const PullResponse before = ShardPull({mine});
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared region" : "TCP");
    // A pull alone of `ids`, over the path under test.
    auto pull_of = [&](const std::vector<uint64_t>& ids) {
      PullRequest pull;
      *pull.add_rows() = Rows(ids);
      ExchangeChunk chunk = PullOnly(pull);
      if (shared) {
        chunk.mutable_shm()->set_region(handle);
        chunk.mutable_shm()->set_answer_offset(0);
      }
      return chunk;
    };
    ExchangeChunk wide = PushAndPull(0, {mine}, 1.0f, {}, 0, shared ? handle : 0);
    wide.mutable_header()->mutable_rows(0)->mutable_data()->append(4, '\0');
    struct Case {
      const char* what;
      ExchangeChunk message;
      grpc::StatusCode code;
      const char* error;
    };
    const std::vector<Case> cases = {
        {"rows whose answer is past --max_reply_bytes", pull_of(many),
         grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_reply_bytes"},
        {"a push of another shard's row",
         PushAndPull(0, {mine, theirs}, 1.0f, {}, 0, shared ? handle : 0),
         grpc::StatusCode::INVALID_ARGUMENT, "belongs to shard 1"},
        {"a pull of another shard's row", pull_of({mine, theirs}),
         grpc::StatusCode::INVALID_ARGUMENT, "belongs to shard 1"},
        {"rows of the wrong width", wide, grpc::StatusCode::INVALID_ARGUMENT, "expected"},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      const int64_t rejected = [&] {
        StatsResponse stats;
        shard_->Stats(&stats);
        return stats.pushes_rejected();
      }();
      const ExchangeOutcome outcome = CallExchange(stub_.get(), {c.message});
      EXPECT_EQ(outcome.status.error_code(), c.code) << outcome.status.error_message();
      EXPECT_THAT(outcome.status.error_message(), HasSubstr(c.error));
      StatsResponse stats;
      shard_->Stats(&stats);
      EXPECT_EQ(stats.version(), 0);
      EXPECT_EQ(stats.embeddings(0).rows(), 0);
      if (c.message.header().rows_size() > 0) {
        EXPECT_EQ(stats.pushes_rejected(), rejected + 1);
      }
      const PullResponse after = ShardPull({mine});
      EXPECT_EQ(after.rows(0).data(), before.rows(0).data());
      EXPECT_EQ(after.variables(0).data(), before.variables(0).data());
      EXPECT_TRUE(Eventually([&] { return server_.service->open_streams().open() == 0; }));
    }
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
