// Embedding rows through a worker's shared region (ShmTransfer.push_rows,
// pull_rows), against a real shard behind gRPC on 127.0.0.1: the same
// exchanges with the rows inline in the headers and in the region answer
// the same rows, bit for bit, and leave the same shard; rows placed badly
// in the region (outside it, lists that do not match, a region shrunk, an
// answer with no room) are refused with INVALID_ARGUMENT before anything
// is applied.
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ps_server/service/exchange_rows_testing.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"

namespace pst {
namespace PST_FILE_ID {

using rows_testing::ExchangeRowsTest;
using ::testing::HasSubstr;

// Where the tests put rows in a region: past the dense gradient and answer.
constexpr int64_t kRowsAt = 4096;
constexpr int64_t kRegionBytes = 1 << 16;

// What one exchange answered and left, to compare the two paths by.
struct Answered {
  bool ok = false;
  PushResponse::Outcome outcome = PushResponse::OUTCOME_UNSPECIFIED;
  int64_t version = 0;
  std::string rows;  // the answered rows' bytes, every table's in order
  std::string w;     // the dense answer's bytes
};

class ShmExchangeRowsTest : public ExchangeRowsTest {
 protected:
  // Attaches `region` (named) for `worker`: the answer, which says whether
  // the shard reads rows in the region.
  ShmAttachResponse AttachAnswer(SharedRegion& region, int worker) {
    ShmAttachRequest request;
    request.set_worker(worker);
    request.set_bytes(static_cast<int64_t>(region.bytes().size()));
    request.set_boot_id(*HostBootId());
    request.set_name(region.name());
    request.set_proof(region.proof());
    ShmAttachResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->ShmAttach(&context, request, &response).ok());
    return response;
  }

  // Runs `chunk` with its rows inline (`in_region` false) or moved into
  // `region` from kRowsAt, and takes what it answered.
  Answered Run(ExchangeChunk chunk, const SharedRegion& region, bool in_region,
               DType dtype = FLOAT32) {
    chunk.mutable_pull()->set_dtype(dtype);
    int64_t rows_answer = 0;
    if (in_region) {
      chunk = RowsInRegion(std::move(chunk), region, kRowsAt);
      rows_answer = chunk.shm().rows_answer_offset();
    }
    const ExchangeOutcome outcome = CallExchange(stub_.get(), {chunk});
    Answered answered;
    answered.ok = outcome.status.ok();
    EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    if (!outcome.status.ok() || outcome.done() == nullptr) return answered;
    answered.outcome = outcome.done()->push().outcome();
    answered.version = outcome.done()->version();
    const PullResponse& header = outcome.answers[0].header();
    int64_t at = rows_answer;
    for (const EmbeddingRows& rows : header.rows()) {
      EXPECT_EQ(rows.table(), "emb");
      EXPECT_EQ(rows.dtype(), dtype);
      if (!in_region) {
        answered.rows += rows.data();
        continue;
      }
      EXPECT_TRUE(rows.data().empty()) << "rows answered in the region came inline too";
      // The values of the ids pulled (one table's), as the header path has them.
      const size_t bytes = pulled_.size() * kDim * DTypeBytes(dtype);
      answered.rows.append(region.bytes().data() + at, bytes);
      at += static_cast<int64_t>(bytes);
    }
    if (header.variables_size() > 0) {
      const size_t bytes = kDense * DTypeBytes(dtype);
      answered.w.assign(region.bytes().data() + kDense * sizeof(float), bytes);
    }
    return answered;
  }

  // Every table's rows, optimizer state and counters, and "w".
  std::string ShardState() {
    const ShardCheckpoint snapshot = shard_->Snapshot();
    std::string state;
    for (const ShardCheckpoint::Embedding& e : snapshot.embeddings()) {
      state += e.SerializeAsString();
    }
    for (const ShardCheckpoint::Variable& v : snapshot.variables()) {
      state += v.SerializeAsString();
    }
    return state + std::to_string(snapshot.version());
  }

  // The ids the exchange under way pulls.
  std::vector<uint64_t> pulled_;
};

// The same exchanges, through the region's header path and through the
// region: the same answers and the same shard, bit for bit.
TEST_F(ShmExchangeRowsTest, RowsInTheRegionAnswerAndApplyAsRowsInTheHeader) {
  struct Step {
    std::vector<uint64_t> pushed;
    float g;
    std::vector<uint64_t> pulled;
    bool dense;
    DType dtype;
  };
  const std::vector<Step> steps = {
      {{1, 2}, 0.25f, {2, 3}, true, FLOAT32},
      {{7}, 1.0f, {7, 1}, false, FLOAT32},
      {{2, 3, 9}, -0.5f, {9, 2, 1}, true, BFLOAT16},
      {{}, 0.0f, {3, 7}, true, FLOAT16},
      {{4}, 2.0f, {}, false, FLOAT32},
  };
  std::vector<std::vector<Answered>> answers(2);
  std::vector<std::string> states(2);
  for (bool in_region : {false, true}) {
    SCOPED_TRACE(in_region ? "rows in the region" : "rows in the headers");
    Start(ASYNC);
    absl::StatusOr<std::unique_ptr<SharedRegion>> region =
        SharedRegion::Create(kRegionBytes, SharedRegion::Kind::kNamed);
    ASSERT_TRUE(region.ok()) << region.status();
    const ShmAttachResponse attached = AttachAnswer(**region, 0);
    EXPECT_TRUE(attached.rows_in_region());
    const std::vector<float> gradient(kDense, 0.5f);
    for (const Step& step : steps) {
      std::memcpy((*region)->bytes().data(), gradient.data(), sizeof(float) * kDense);
      pulled_ = step.pulled;
      answers[in_region].push_back(
          Run(PushAndPull(0, step.pushed, step.g, step.pulled, 0, attached.region(), step.dense),
              **region, in_region, step.dtype));
    }
    states[in_region] = ShardState();
    Stop();
  }
  ASSERT_EQ(answers[0].size(), answers[1].size());
  for (size_t i = 0; i < answers[0].size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(answers[1][i].ok);
    EXPECT_EQ(answers[0][i].outcome, answers[1][i].outcome);
    EXPECT_EQ(answers[0][i].version, answers[1][i].version);
    EXPECT_EQ(answers[0][i].rows, answers[1][i].rows);
    EXPECT_EQ(answers[0][i].rows.size(),
              steps[i].pulled.size() * kDim * static_cast<size_t>(DTypeBytes(steps[i].dtype)));
    EXPECT_EQ(answers[0][i].w, answers[1][i].w);
  }
  EXPECT_EQ(states[0], states[1]);
}

// A pull of rows alone, its ids and its answer in the region.
TEST_F(ShmExchangeRowsTest, APullOfRowsAloneNamesAndGetsThemInTheRegion) {
  Start(ASYNC);
  uint64_t handle = 0;
  std::unique_ptr<SharedRegion> region = AttachRegion(0, &handle);
  PullRequest pull;
  *pull.add_rows() = Rows({5, 1, 8});
  pull.set_rows_only(true);
  ExchangeChunk chunk = PullOnly(pull);
  chunk.mutable_shm()->set_region(handle);
  chunk = RowsInRegion(std::move(chunk), *region, kRowsAt);
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {chunk});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  const PullResponse& header = outcome.answers[0].header();
  ASSERT_EQ(header.rows_size(), 1);
  EXPECT_TRUE(header.rows(0).data().empty());
  const std::string expected = ShardPull({5, 1, 8}).rows(0).data();
  EXPECT_EQ(std::string(region->bytes().data() + chunk.shm().rows_answer_offset(), expected.size()),
            expected);
}

// Refused before anything is applied, the model and the table untouched.
TEST_F(ShmExchangeRowsTest, RowsPlacedBadlyInTheRegionAreRefusedBeforeAnythingIsApplied) {
  RpcLimits limits;
  limits.max_rows_per_pull = 64;
  limits.max_request_bytes = 16 << 10;
  Start(ASYNC, /*num_shards=*/1, limits);
  int owner = -1;
  uint64_t handle = 0;
  std::unique_ptr<SharedRegion> region =
      AttachFilledRegion(stub_.get(), 0, kRegionBytes, kDense, 0.5f, &handle, &owner);
  ASSERT_GE(owner, 0);
  const int64_t size = static_cast<int64_t>(region->bytes().size());
  // A good exchange, pushing rows 1 and 2 and pulling 2 and 3, all in the
  // region; each case spoils one thing of it.
  const ExchangeChunk good =
      RowsInRegion(PushAndPull(0, {1, 2}, 1.0f, {2, 3}, 0, handle), *region, kRowsAt);
  auto spoilt = [&](auto spoil) {
    ExchangeChunk chunk = good;
    spoil(&chunk);
    return chunk;
  };
  struct Case {
    const char* what;
    ExchangeChunk message;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"pushed ids past the region's end", spoilt([&](ExchangeChunk* c) {
         c->mutable_shm()->mutable_push_rows(0)->set_ids_offset(size - 8);
       }),
       "outside the shared region"},
      {"pushed rows at a negative offset", spoilt([](ExchangeChunk* c) {
         c->mutable_shm()->mutable_push_rows(0)->set_data_offset(-4);
       }),
       "outside the shared region"},
      {"a negative count of pushed bytes", spoilt([](ExchangeChunk* c) {
         c->mutable_shm()->mutable_push_rows(0)->set_data_bytes(-32);
       }),
       "outside the shared region"},
      {"an offset that overflows", spoilt([](ExchangeChunk* c) {
         c->mutable_shm()->mutable_push_rows(0)->set_ids_offset(INT64_MAX - 4);
       }),
       "outside the shared region"},
      {"more places than tables pushed",
       spoilt([](ExchangeChunk* c) { *c->mutable_shm()->add_push_rows() = c->shm().push_rows(0); }),
       "the header names 1"},
      {"pushed rows both inline and in the region",
       spoilt([](ExchangeChunk* c) { c->mutable_header()->mutable_rows(0)->set_ids("12345678"); }),
       "both in the header and in the shared region"},
      {"pushed rows past --max_message_bytes", spoilt([](ExchangeChunk* c) {
         c->mutable_shm()->mutable_push_rows(0)->set_data_bytes(20 << 10);
       }),
       "--max_message_bytes"},
      {"pulled ids past the region's end", spoilt([&](ExchangeChunk* c) {
         c->mutable_shm()->mutable_pull_rows(0)->set_ids_offset(size);
       }),
       "outside the shared region"},
      {"pulled ids with data",
       spoilt([](ExchangeChunk* c) { c->mutable_shm()->mutable_pull_rows(0)->set_data_bytes(8); }),
       "with no data"},
      {"more pulled ids than --max_rows_per_pull", spoilt([](ExchangeChunk* c) {
         c->mutable_shm()->mutable_pull_rows(0)->set_ids_bytes(65 * 8);
       }),
       "--max_rows_per_pull"},
      {"places for the pull's ids but no pull's tables",
       spoilt([](ExchangeChunk* c) { c->mutable_pull()->clear_rows(); }), "the pull names 0"},
      {"no room for the answer's rows",
       spoilt([&](ExchangeChunk* c) { c->mutable_shm()->set_rows_answer_offset(size - 8); }),
       "the answer's rows"},
  };
  const PullResponse before = ShardPull({1, 2, 3});
  auto expect_untouched = [&] {
    StatsResponse stats;
    shard_->Stats(&stats);
    EXPECT_EQ(stats.version(), 0);
    EXPECT_EQ(stats.embeddings(0).rows(), 0);
    const PullResponse after = ShardPull({1, 2, 3});
    EXPECT_EQ(after.rows(0).data(), before.rows(0).data());
    EXPECT_EQ(after.variables(0).data(), before.variables(0).data());
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const ExchangeOutcome outcome = CallExchange(stub_.get(), {c.message});
    EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << outcome.status.error_message();
    EXPECT_THAT(outcome.status.error_message(), HasSubstr(c.error));
    expect_untouched();
    EXPECT_TRUE(Eventually([&] { return server_.service->open_streams().open() == 0; }));
  }
  // The good exchange, once the worker has shrunk its region under the
  // shard: refused, not a fault.
  ASSERT_EQ(ftruncate(owner, 4096), 0);
  close(owner);
  const ExchangeOutcome shrunk = CallExchange(stub_.get(), {good});
  EXPECT_EQ(shrunk.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << shrunk.status.error_message();
  expect_untouched();
}

// What the shard copied out of the region is what it checks and applies:
// rows written there after the exchange's request change nothing of it.
TEST_F(ShmExchangeRowsTest, TheShardAppliesTheRowsItCopiedOut) {
  Start(ASYNC);
  uint64_t handle = 0;
  std::unique_ptr<SharedRegion> region = AttachRegion(0, &handle);
  const std::vector<float> initial = Floats(ShardPull({1}).rows(0).data());
  const ExchangeChunk chunk =
      RowsInRegion(PushAndPull(0, {1}, 0.25f, {1}, 0, handle), *region, kRowsAt);
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {chunk});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  // The worker overwrites its gradient rows after the answer.
  const ShmRows& place = chunk.shm().push_rows(0);
  std::memset(region->bytes().data() + place.data_offset(), 0xff, place.data_bytes());
  const std::vector<float> after = Floats(ShardPull({1}).rows(0).data());
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(after[k], initial[k] - 0.25f);
  std::vector<float> answered(kDim);
  std::memcpy(answered.data(), region->bytes().data() + chunk.shm().rows_answer_offset(),
              sizeof(float) * kDim);
  EXPECT_EQ(answered, after);
}

}  // namespace PST_FILE_ID
}  // namespace pst
