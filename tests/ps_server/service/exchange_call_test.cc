// The Exchange call as a state machine (ps_server/service/exchange_phase.h), against
// a real shard behind gRPC on 127.0.0.1: its transition tables; a client
// that goes away in each state where the call waits leaves no exchange
// open, no waiter, the model untouched and the server serving the next
// exchange; and a failure in each of its paths (TCP, a shared region) ends
// the call with the status its contract names.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps_server/service/exchange_phase.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;

constexpr int64_t kElements = 1000;
constexpr int64_t kBytes = kElements * sizeof(float);

TEST(ExchangePhaseTest, OnlyTheListedTransitionsAreLegal) {
  using P = ExchangePhase;
  const std::vector<std::pair<P, P>> legal = {
      {P::kReadingHeader, P::kReadingPush},   {P::kReadingPush, P::kClaimingRegion},
      {P::kReadingPush, P::kApplying},        {P::kReadingPush, P::kPulling},
      {P::kClaimingRegion, P::kApplying},     {P::kClaimingRegion, P::kPulling},
      {P::kApplying, P::kAwaitingTurn},       {P::kApplying, P::kPulling},
      {P::kApplying, P::kAnswered},           {P::kAwaitingTurn, P::kApplying},
      {P::kPulling, P::kAwaitingVersion},     {P::kPulling, P::kAnswered},
      {P::kAwaitingVersion, P::kPulling},
  };
  for (int from = 0; from <= static_cast<int>(P::kAnswered); ++from) {
    for (int to = 0; to <= static_cast<int>(P::kAnswered); ++to) {
      const std::pair<P, P> step{static_cast<P>(from), static_cast<P>(to)};
      SCOPED_TRACE(absl::StrCat(NameOf(step.first), " -> ", NameOf(step.second)));
      EXPECT_EQ(CanEnter(step.first, step.second),
                std::find(legal.begin(), legal.end(), step) != legal.end());
    }
  }
}

TEST(ExchangeWireTest, OnlyTheListedTransitionsAreLegal) {
  using W = ExchangeWire;
  const std::vector<std::pair<W, W>> legal = {
      {W::kIdle, W::kWriting},        {W::kIdle, W::kWritingLast}, {W::kIdle, W::kFinishing},
      {W::kIdle, W::kDone},           {W::kWriting, W::kIdle},     {W::kWritingLast, W::kFinishing},
      {W::kFinishing, W::kDone},
  };
  for (int from = 0; from <= static_cast<int>(W::kDone); ++from) {
    for (int to = 0; to <= static_cast<int>(W::kDone); ++to) {
      const std::pair<W, W> step{static_cast<W>(from), static_cast<W>(to)};
      SCOPED_TRACE(absl::StrCat(NameOf(step.first), " -> ", NameOf(step.second)));
      EXPECT_EQ(CanEnter(step.first, step.second),
                std::find(legal.begin(), legal.end(), step) != legal.end());
    }
  }
}

TEST(ExchangePhaseDeathTest, AnIllegalTransitionAborts) {
  EXPECT_DEATH(CheckTransition(ExchangePhase::kAnswered, ExchangePhase::kPulling),
               "Answered -> Pulling");
  EXPECT_DEATH(CheckTransition(ExchangeWire::kDone, ExchangeWire::kIdle), "Done -> Idle");
}

// An exchange the test drives message by message.
struct OpenExchange {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> stream;

  explicit OpenExchange(ParameterServer::Stub* stub) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream = stub->Exchange(&context);
  }
  // The client goes away; what the call then ends with.
  grpc::Status Cancel() {
    context.TryCancel();
    ExchangeAnswer answer;
    while (stream->Read(&answer)) {
    }
    return stream->Finish();
  }
};

class ExchangeCallTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({{"w", kElements}}); }
  void TearDown() override {
    shard_->BeginShutdown();
    server_.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  // An ASYNC shard of two workers holding `variables` (every value 1),
  // learning rate 1, shared memory on.
  void Start(const std::vector<std::pair<std::string, int64_t>>& variables,
             const RpcLimits& limits = {}) {
    if (shard_ != nullptr) TearDown();
    ShardOptions options;
    options.mode = ASYNC;
    options.num_workers = 2;
    options.stalled_stream_timeout = absl::Minutes(10);
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    InitRequest init;
    for (const auto& [name, elements] : variables) {
      EncodeTensor(name, std::vector<int64_t>{elements}, std::vector<float>(elements, 1.0f),
                   init.add_variables());
    }
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

  const OpenStreams& streams() const { return server_.service->open_streams(); }

  // Nothing of an ended exchange is left: no exchange open, no waiter, no
  // staged update, no parked claim.
  void ExpectNothingLeft() {
    EXPECT_TRUE(Eventually([&] {
      return streams().open() == 0 && shard_->waiting_pulls() == 0 &&
             shard_->waiting_updates() == 0 && !shard_->streamed_update_staged() &&
             server_.service->shared_region_waiters() == 0;
    })) << streams().open() << " open, " << shard_->waiting_pulls() << " pulls and "
        << shard_->waiting_updates() << " updates waiting, "
        << server_.service->shared_region_waiters() << " claims parked";
    EXPECT_EQ(streams().push_buffer_bytes(), 0);
  }

  void ExpectModelUntouched() {
    PullRequest pull;
    pull.add_names("w");
    PullResponse response;
    ASSERT_TRUE(Pull(*shard_, pull, absl::Now(), &response).ok());
    EXPECT_EQ(response.version(), 0);
    std::vector<float> values(kElements);
    DecodeTensor(response.variables(0), values);
    EXPECT_THAT(values, Each(Eq(1.0f)));
  }

  // The server still serves: a TCP push and pull by `worker` is applied.
  void ExpectServes(int worker = 0) {
    PushRequest push;
    push.set_worker(worker);
    push.set_computed_at_version(shard_->version());
    EncodeTensor("w", std::vector<int64_t>{kElements}, std::vector<float>(kElements, 0.5f),
                 push.add_gradients());
    ExchangeChunk message = WholePush(push);
    message.mutable_pull();
    const ExchangeOutcome outcome = CallExchange(stub_.get(), {message});
    ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
    ASSERT_NE(outcome.done(), nullptr);
    EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
  }

  // A header pushing "w" by `worker` (the whole variable, float32).
  static ExchangeChunk PushHeader(int worker) {
    ExchangeChunk chunk;
    chunk.mutable_header()->set_worker(worker);
    Tensor* gradient = chunk.mutable_header()->add_gradients();
    gradient->set_name("w");
    gradient->set_dtype(FLOAT32);
    return chunk;
  }
  // `chunk` with `bytes` of gradient at `offset` (values 0.25).
  static ExchangeChunk WithPiece(ExchangeChunk chunk, int64_t offset, int64_t bytes,
                                 int tensor = 0) {
    const std::vector<float> values(bytes / sizeof(float), 0.25f);
    TensorPiece* piece = chunk.add_pieces();
    piece->set_tensor(tensor);
    piece->set_offset(offset);
    piece->set_data(reinterpret_cast<const char*>(values.data()), bytes);
    return chunk;
  }

  // Holds the shard's staging, as a streamed update of `worker` under way:
  // other updates wait for their turn until it is dropped.
  std::unique_ptr<StreamedUpdate> HoldTheTurn(int worker) {
    absl::StatusOr<ParameterShard::StreamedPush> holder =
        shard_->BeginStreamedPush(PushHeader(worker).header());
    EXPECT_TRUE(holder.ok()) << holder.status();
    EXPECT_NE(holder->update, nullptr);
    return std::move(holder->update);
  }

  // A region of `bytes` attached by worker 0, the gradient at its start;
  // `handle` names it. `owner`, if given, gets a descriptor of the worker's
  // own, to shrink it with.
  std::unique_ptr<SharedRegion> AttachRegion(uint64_t* handle, int* owner = nullptr,
                                             int64_t bytes = 2 * kBytes) {
    return AttachFilledRegion(stub_.get(), 0, bytes, kElements, 0.25f, handle, owner);
  }
  // A push and pull of "w" through region `handle`: the gradient at 0, the
  // answer after it.
  static ExchangeChunk SharedPushPull(uint64_t handle, int64_t elements = kElements) {
    ExchangeChunk chunk = PushHeader(0);
    chunk.mutable_header()->mutable_gradients(0)->add_shape(elements);
    chunk.mutable_pull();
    chunk.mutable_shm()->set_region(handle);
    chunk.mutable_shm()->set_push_offset(0);
    chunk.mutable_shm()->set_answer_offset(kBytes);
    return chunk;
  }
  // A pull alone of a version that does not come.
  static ExchangeChunk EndlessPull() {
    PullRequest pull;
    pull.set_min_version(5);
    pull.set_timeout_ms(600000);
    return PullOnly(pull);
  }

  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_F(ExchangeCallTest, ACancelWhileWaitingForTheHeaderLeavesNothing) {
  OpenExchange exchange(stub_.get());
  ASSERT_TRUE(Eventually([&] { return streams().open() == 1; }));
  EXPECT_EQ(exchange.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  ExpectNothingLeft();
  ExpectModelUntouched();
  ExpectServes();
}

TEST_F(ExchangeCallTest, ACancelMidPushDropsTheUpdateUnapplied) {
  OpenExchange exchange(stub_.get());
  ASSERT_TRUE(exchange.stream->Write(WithPiece(PushHeader(0), 0, kBytes / 2)));
  ASSERT_TRUE(Eventually([&] { return shard_->streamed_update_staged(); }))
      << "the push never reached the shard";
  EXPECT_EQ(exchange.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  ExpectNothingLeft();
  ExpectModelUntouched();
  ExpectServes();
}

TEST_F(ExchangeCallTest, ACancelWhileAwaitingItsTurnDropsTheWaiter) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared region" : "TCP");
    uint64_t handle = 0;
    std::unique_ptr<SharedRegion> region = AttachRegion(&handle);
    std::unique_ptr<StreamedUpdate> holder = HoldTheTurn(/*worker=*/1);
    OpenExchange exchange(stub_.get());
    ASSERT_TRUE(exchange.stream->Write(shared ? SharedPushPull(handle)
                                              : WithPiece(PushHeader(0), 0, kBytes)));
    ASSERT_TRUE(Eventually([&] { return shard_->waiting_updates() == 1; }))
        << "the push never waited for its turn";
    EXPECT_EQ(exchange.Cancel().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(Eventually([&] { return shard_->waiting_updates() == 0; }));
    holder.reset();  // dropped, unapplied: the turn is free
    ExpectNothingLeft();
    ExpectModelUntouched();
  }
  ExpectServes();
}

TEST_F(ExchangeCallTest, ACancelWhileAwaitingTheVersionDropsTheWaiter) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared region" : "TCP");
    uint64_t handle = 0;
    std::unique_ptr<SharedRegion> region = AttachRegion(&handle);
    ExchangeChunk pull = EndlessPull();
    if (shared) pull.mutable_shm()->set_region(handle);
    OpenExchange exchange(stub_.get());
    ASSERT_TRUE(exchange.stream->Write(pull));
    ASSERT_TRUE(Eventually([&] { return shard_->waiting_pulls() == 1; }))
        << "the pull never waited for its version";
    EXPECT_EQ(exchange.Cancel().error_code(), grpc::StatusCode::CANCELLED);
    ExpectNothingLeft();
    ExpectModelUntouched();
  }
  ExpectServes();
}

TEST_F(ExchangeCallTest, ACancelWhileWaitingForTheRegionDropsTheClaim) {
  uint64_t handle = 0;
  std::unique_ptr<SharedRegion> region = AttachRegion(&handle);
  ExchangeChunk holding = EndlessPull();
  holding.mutable_shm()->set_region(handle);
  OpenExchange holder(stub_.get());
  ASSERT_TRUE(holder.stream->Write(holding));
  ASSERT_TRUE(Eventually([&] { return shard_->waiting_pulls() == 1; }));
  OpenExchange waiting(stub_.get());
  ASSERT_TRUE(waiting.stream->Write(SharedPushPull(handle)));
  ASSERT_TRUE(Eventually([&] { return server_.service->shared_region_waiters() == 1; }))
      << "the exchange never waited for the region";
  EXPECT_EQ(waiting.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&] { return server_.service->shared_region_waiters() == 0; }));
  // The waiter leaves the region's queue on the cancel; its stream closes
  // when gRPC calls OnDone after it, a moment later.
  EXPECT_TRUE(Eventually([&] { return streams().open() == 1; }))  // the holder's
      << streams().open() << " streams open";
  EXPECT_EQ(holder.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  ExpectNothingLeft();
  ExpectModelUntouched();
  // The region serves its worker again.
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {SharedPushPull(handle)});
  EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_EQ(shard_->version(), 1);
}

// A client that reads the answer's first message and no more holds the
// server's next write; its cancel fails the write and ends the call.
TEST_F(ExchangeCallTest, ACancelWhileTheAnswerIsWrittenEndsTheCall) {
  Start({{"w", kElements}, {"big", 4 << 20}});  // 16 MiB: more than the connection's windows
  OpenExchange exchange(stub_.get());
  PullRequest pull;
  pull.add_names("big");
  ASSERT_TRUE(exchange.stream->Write(PullOnly(pull)));
  ASSERT_TRUE(exchange.stream->WritesDone());
  ExchangeAnswer first;
  ASSERT_TRUE(exchange.stream->Read(&first)) << "no answer came";
  EXPECT_EQ(streams().open(), 1);
  EXPECT_EQ(exchange.Cancel().error_code(), grpc::StatusCode::CANCELLED);
  ExpectNothingLeft();
  ExpectModelUntouched();
  ExpectServes();
}

// Requests refused before anything is applied, whatever the path.
TEST_F(ExchangeCallTest, AFailureInEachPathEndsTheCallWithItsStatus) {
  uint64_t handle = 0;
  int owner = -1;
  std::unique_ptr<SharedRegion> region = AttachRegion(&handle, &owner);
  ASSERT_GE(owner, 0);
  ExchangeChunk shared_pull = PullOnly(PullRequest());
  shared_pull.mutable_shm()->set_region(handle);
  ExchangeChunk past_the_end = SharedPushPull(handle);
  past_the_end.mutable_shm()->set_push_offset(2 * kBytes - 4);
  ExchangeChunk unknown_region = SharedPushPull(handle + 1000);
  ExchangeChunk neither;
  neither.mutable_header()->set_worker(0);
  struct Case {
    const char* what;
    std::vector<ExchangeChunk> messages;
    grpc::StatusCode code;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"no message", {}, grpc::StatusCode::INVALID_ARGUMENT, "no header"},
      {"no header", {WithPiece(ExchangeChunk(), 0, kBytes)}, grpc::StatusCode::INVALID_ARGUMENT,
       "must start with its header"},
      {"neither push nor pull", {neither}, grpc::StatusCode::INVALID_ARGUMENT,
       "neither a push"},
      {"a second header",
       {WithPiece(PushHeader(0), 0, kBytes / 2), WithPiece(PushHeader(0), kBytes / 2, kBytes / 2)},
       grpc::StatusCode::INVALID_ARGUMENT, "second header"},
      {"TCP: a piece naming no tensor", {WithPiece(PushHeader(0), 0, kBytes, /*tensor=*/1)},
       grpc::StatusCode::INVALID_ARGUMENT, "names tensor 1"},
      {"TCP: pieces in a pull", {WithPiece(PullOnly(PullRequest()), 0, 4)},
       grpc::StatusCode::INVALID_ARGUMENT, "pushes nothing"},
      {"TCP: a push refused by the shard",
       {[] {
         ExchangeChunk chunk = WithPiece(PushHeader(0), 0, kBytes);
         chunk.mutable_header()->mutable_gradients(0)->set_name("v");
         return chunk;
       }()},
       grpc::StatusCode::INVALID_ARGUMENT, "unknown variable"},
      {"TCP: the request ends before the push does", {WithPiece(PushHeader(0), 0, kBytes / 2)},
       grpc::StatusCode::INVALID_ARGUMENT, "missing chunks"},
      {"shared: pieces", {WithPiece(SharedPushPull(handle), 0, 4)},
       grpc::StatusCode::INVALID_ARGUMENT, "carries no pieces"},
      {"shared: a push refused by the shard", {SharedPushPull(handle, kElements - 1)},
       grpc::StatusCode::INVALID_ARGUMENT, "shape"},
      {"shared: a push past the region's end", {past_the_end},
       grpc::StatusCode::INVALID_ARGUMENT, "region"},
      {"shared: a region the shard does not hold", {unknown_region},
       grpc::StatusCode::NOT_FOUND, "no shared region"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const ExchangeOutcome outcome = CallExchange(stub_.get(), c.messages);
    EXPECT_EQ(outcome.status.error_code(), c.code) << outcome.status.error_message();
    EXPECT_THAT(outcome.status.error_message(), HasSubstr(c.error));
    ExpectNothingLeft();
    ExpectModelUntouched();
  }
  // A shared pull alone checks its region as it claims it.
  ASSERT_EQ(ftruncate(owner, 4096), 0);
  close(owner);
  const ExchangeOutcome shrunk = CallExchange(stub_.get(), {shared_pull});
  EXPECT_EQ(shrunk.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(shrunk.status.error_message(), HasSubstr("shrank"));
  ExpectNothingLeft();
  ExpectModelUntouched();
  ExpectServes();
}

}  // namespace PST_FILE_ID
}  // namespace pst
