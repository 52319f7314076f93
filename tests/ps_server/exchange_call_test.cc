// The Exchange call as a state machine (ps_server/exchange_phase.h), against
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
#include "ps_server/exchange_phase.h"
#include "ps_server/ps_service.h"
#include "placement/row_placement.h"
#include "ps_server/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"

namespace pst {
namespace {

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
// A region of `bytes` made here and attached by `worker` through `stub`,
// its first `elements` floats set to `value` (a gradient at offset 0);
// `*handle` gets the shard's handle for it, `*owner` (if given) a
// descriptor of its own, to shrink it with.
std::unique_ptr<SharedRegion> AttachFilledRegion(ParameterServer::Stub* stub, int worker,
                                                 int64_t bytes, int64_t elements, float value,
                                                 uint64_t* handle, int* owner = nullptr) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(bytes);
  EXPECT_TRUE(region.ok()) << region.status();
  if (owner != nullptr) *owner = shm_open((*region)->name().c_str(), O_RDWR, 0);
  ShmAttachRequest request;
  request.set_worker(worker);
  request.set_name((*region)->name());
  request.set_bytes(static_cast<int64_t>((*region)->bytes().size()));
  request.set_boot_id(*HostBootId());
  request.set_proof((*region)->proof());
  ShmAttachResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->ShmAttach(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  *handle = response.region();
  const std::vector<float> gradient(static_cast<size_t>(elements), value);
  std::memcpy((*region)->bytes().data(), gradient.data(), gradient.size() * sizeof(float));
  return std::move(*region);
}

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
  EXPECT_EQ(streams().open(), 1);  // the holder's
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

}  // namespace
}  // namespace pst
