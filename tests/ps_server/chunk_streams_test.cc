// The data plane's one call, Exchange, end to end over loopback gRPC:
// PsClient streams a model larger than one chunk to a real shard and back,
// bit for bit; a pull is an exchange with no push, a push one with no pull;
// and a shard refuses malformed exchanges with INVALID_ARGUMENT, leaving
// the model as it was.
#include "ps_server/chunk_streams.h"

#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "common/tensor_stream.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "placement/variable_spec.h"
#include "ps_server/ps_service.h"
#include "ps_server/shard_calls.h"
#include "ps_server/streamed_update.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/support/thread_count.h"
#include "worker/ps_client.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

// A shard (ASYNC unless told, SGD with learning rate 1: a push of g
// subtracts g) behind a real gRPC server on 127.0.0.1.
class ServedShard {
 public:
  explicit ServedShard(int workers = 1,
                       absl::Duration stalled_stream_timeout = absl::Seconds(5),
                       Mode mode = ASYNC) {
    ShardOptions options;
    options.mode = mode;
    options.stalled_stream_timeout = stalled_stream_timeout;
    options.num_workers = workers;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    auto running = StartGrpcServer("127.0.0.1:0", shard_.get(), AdminHooks{});
    EXPECT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
    address_ = "127.0.0.1:" + std::to_string(server_.port);
  }
  ~ServedShard() {
    shard_->BeginShutdown();
    server_.grpc_server->Shutdown();
  }
  const std::string& address() const { return address_; }
  ParameterShard* shard() { return shard_.get(); }

 private:
  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::string address_;
};

// Values exact in float32, float16 and bfloat16 (at most 7 significant bits).
std::vector<float> Ramp(int64_t n, float start, float step) {
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = start + step * static_cast<float>(i % 64);
  return values;
}

// Models whose wire size sits at and around the chunk size, so that both the
// unary path (<= one chunk) and streams of 2 or many chunks are exercised.
struct BoundaryCase {
  const char* name;
  std::vector<VariableSpec> model;
  DType dtype;
};
std::vector<BoundaryCase> ChunkBoundaryCases() {
  const int64_t chunk_floats = kChunkBytes / 4;
  return {
      {"one chunk exactly (unary)", {{"w", {chunk_floats}}}, FLOAT32},
      {"chunk + 1 element", {{"w", {chunk_floats + 1}}}, FLOAT32},
      {"chunk - 1 element, then a bias", {{"w", {chunk_floats - 1}}, {"b", {2}}}, FLOAT32},
      {"many chunks, several variables",
       {{"k", {1000, 1001}}, {"b", {7}}, {"k2", {3, 333}}}, FLOAT32},
      {"bf16, odd count past two chunks", {{"w", {kChunkBytes + 3}}}, BFLOAT16},
      {"fp16, odd counts", {{"a", {kChunkBytes / 2 + 1}}, {"c", {5}}}, FLOAT16},
  };
}

// A model's initial values, a gradient and a buffer to pull into, with the
// spans PsClient takes. Values are exact in every wire dtype (Ramp).
class ModelBuffers {
 public:
  explicit ModelBuffers(const std::vector<VariableSpec>& model) : model_(model) {
    for (const VariableSpec& spec : model) {
      initial.push_back(Ramp(spec.size(), 1.0f, 0.5f));
      gradient.push_back(Ramp(spec.size(), -4.0f, 1.0f));
      pulled.emplace_back(spec.size(), 0.0f);
    }
    for (size_t v = 0; v < model.size(); ++v) {
      initial_spans.emplace_back(initial[v]);
      gradient_spans.emplace_back(gradient[v]);
      pulled_spans.emplace_back(pulled[v]);
    }
  }
  ModelBuffers(const ModelBuffers&) = delete;
  ModelBuffers& operator=(const ModelBuffers&) = delete;

  // Whether `pulled` holds the initial values after `steps` SGD steps of
  // learning rate 1 with the gradient; names the first element that does not.
  ::testing::AssertionResult PulledAfter(int steps) const {
    for (size_t v = 0; v < model_.size(); ++v) {
      for (size_t i = 0; i < pulled[v].size(); ++i) {
        const float expected = initial[v][i] - static_cast<float>(steps) * gradient[v][i];
        if (pulled[v][i] != expected) {
          return ::testing::AssertionFailure() << model_[v].name << "[" << i << "] is "
                                               << pulled[v][i] << ", expected " << expected
                                               << " after " << steps << " step(s)";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::vector<std::vector<float>> initial, gradient, pulled;
  std::vector<std::span<const float>> initial_spans, gradient_spans;
  std::vector<std::span<float>> pulled_spans;

 private:
  std::vector<VariableSpec> model_;
};

TEST(ChunkStreamsTest, PullAndPushRoundTripAtEveryChunkBoundary) {
  for (const BoundaryCase& c : ChunkBoundaryCases()) {
    SCOPED_TRACE(c.name);
    ServedShard served;
    auto client = PsClient::Connect({served.address()}, 0, absl::Seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables(c.model);
    (*client)->set_wire_dtype(c.dtype);
    ModelBuffers buffers(c.model);
    ASSERT_TRUE((*client)->Init(buffers.initial_spans).ok());
    std::vector<int64_t> versions;
    ASSERT_TRUE((*client)->Pull({0}, absl::Seconds(10), buffers.pulled_spans, &versions).ok());
    EXPECT_TRUE(buffers.PulledAfter(0));
    std::vector<PushResponse> responses;
    absl::Status pushed = (*client)->Push(versions, buffers.gradient_spans, &responses);
    ASSERT_TRUE(pushed.ok()) << pushed;
    EXPECT_EQ(responses[0].outcome(), PushResponse::APPLIED);
    ASSERT_TRUE((*client)->Pull({1}, absl::Seconds(10), buffers.pulled_spans, &versions).ok());
    EXPECT_EQ(versions[0], 1);
    EXPECT_TRUE(buffers.PulledAfter(1));
  }
}

// PushPull gives back what a Push and then a Pull would, in each of its
// ways: streamed back as the push is staged (ASYNC), pulled once a push
// applied as it streamed in is committed (SSP, whose pulls may have to
// wait), and pulled once a reassembled push is in (SYNC, where the pull
// waits for the step).
TEST(ChunkStreamsTest, PushPullReturnsTheUpdatedModelAtEveryChunkBoundary) {
  for (Mode mode : {ASYNC, SSP, SYNC}) {
    for (const BoundaryCase& c : ChunkBoundaryCases()) {
      SCOPED_TRACE(absl::StrCat(c.name, ", ", Mode_Name(mode)));
      ServedShard served(/*workers=*/1, absl::Seconds(5), mode);
      auto client = PsClient::Connect({served.address()}, 0, absl::Seconds(10));
      ASSERT_TRUE(client.ok()) << client.status();
      (*client)->SetVariables(c.model);
      (*client)->set_wire_dtype(c.dtype);
      ModelBuffers buffers(c.model);
      ASSERT_TRUE((*client)->Init(buffers.initial_spans).ok());
      std::vector<int64_t> versions = {0};
      std::vector<PushResponse> responses;
      for (int step = 1; step <= 2; ++step) {
        // As the trainer asks: SYNC wants the step this push completes.
        const std::vector<int64_t> min_versions = {mode == SYNC ? versions[0] + 1 : versions[0]};
        absl::Status exchanged =
            (*client)->PushPull(versions, buffers.gradient_spans, min_versions, absl::Seconds(10),
                                buffers.pulled_spans, &versions, &responses);
        ASSERT_TRUE(exchanged.ok()) << exchanged;
        EXPECT_EQ(responses[0].outcome(), PushResponse::APPLIED);
        EXPECT_EQ(responses[0].version(), step);
        ASSERT_EQ(versions[0], step);
        ASSERT_TRUE(buffers.PulledAfter(step));
      }
    }
  }
}

// SYNC over several shards: two workers exchange at once, each shard holds
// the first gradient until the second arrives, and both workers get the
// averaged step back from every shard, at the step's version. Shares that
// are streamed and shares of one message, whose pull waits for the step
// without a thread.
void ExpectSyncPushPullOfTwoWorkersOverTwoShards(const std::vector<VariableSpec>& model) {
  ServedShard first(/*workers=*/2, absl::Seconds(5), SYNC);
  ServedShard second(/*workers=*/2, absl::Seconds(5), SYNC);
  const std::vector<std::string> addresses = {first.address(), second.address()};
  auto connect = [&](int worker) {
    auto client = PsClient::Connect(addresses, worker, absl::Seconds(10));
    EXPECT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables(model);
    return std::move(*client);
  };
  std::vector<std::vector<float>> initial;
  for (const VariableSpec& spec : model) initial.push_back(Ramp(spec.size(), 1.0f, 0.5f));
  ASSERT_TRUE(connect(0)->Init({initial[0], initial[1]}).ok());
  auto gradient = [](int worker, int64_t n) {
    return worker == 0 ? Ramp(n, -4.0f, 1.0f) : Ramp(n, 2.0f, 0.5f);
  };
  std::vector<std::vector<std::vector<float>>> pulled(2);
  std::vector<std::vector<PushResponse>> responses(2);
  std::vector<std::vector<int64_t>> versions(2, std::vector<int64_t>{0, 0});
  std::vector<absl::Status> results(2);
  auto exchange = [&](int worker) {
    std::unique_ptr<PsClient> client = connect(worker);
    std::vector<std::vector<float>> grads;
    for (const VariableSpec& spec : model) {
      grads.push_back(gradient(worker, spec.size()));
      pulled[worker].emplace_back(spec.size(), 0.0f);
    }
    results[worker] = client->PushPull(
        versions[worker], {grads[0], grads[1]}, /*min_versions=*/{1, 1}, absl::Seconds(10),
        {pulled[worker][0], pulled[worker][1]}, &versions[worker], &responses[worker]);
  };
  std::thread other(exchange, 1);
  exchange(0);
  other.join();
  for (int worker = 0; worker < 2; ++worker) {
    SCOPED_TRACE(absl::StrCat("worker:", worker));
    ASSERT_TRUE(results[worker].ok()) << results[worker];
    EXPECT_EQ(versions[worker], (std::vector<int64_t>{1, 1}));
    for (size_t v = 0; v < model.size(); ++v) {
      const std::vector<float> g0 = gradient(0, model[v].size());
      const std::vector<float> g1 = gradient(1, model[v].size());
      for (size_t i = 0; i < initial[v].size(); ++i) {
        ASSERT_EQ(pulled[worker][v][i], initial[v][i] - (g0[i] + g1[i]) / 2)
            << model[v].name << "[" << i << "]";
      }
    }
  }
  for (int shard = 0; shard < 2; ++shard) {  // one push completed each shard's step
    const int applied = (responses[0][shard].outcome() == PushResponse::APPLIED) +
                        (responses[1][shard].outcome() == PushResponse::APPLIED);
    EXPECT_EQ(applied, 1) << "ps:" << shard;
  }
}

TEST(ChunkStreamsTest, SyncPushPullOfTwoWorkersOverTwoShardsReturnsTheAveragedStep) {
  {
    SCOPED_TRACE("streamed shares");
    ExpectSyncPushPullOfTwoWorkersOverTwoShards({{"w", {1024, 768}}, {"b", {5}}});
  }
  {
    SCOPED_TRACE("shares of one message");
    ExpectSyncPushPullOfTwoWorkersOverTwoShards({{"w", {64, 3}}, {"b", {5}}});
  }
}

// A refused PushPull (a non-finite gradient) is an error to the caller and
// leaves the model as it was, streamed or in one message.
TEST(ChunkStreamsTest, ARefusedPushPullLeavesTheModelUntouched) {
  for (const int64_t elements : {2 * kChunkBytes / 4 + 5, int64_t{100}}) {
    SCOPED_TRACE(elements);
    ServedShard served;
    auto client = PsClient::Connect({served.address()}, 0, absl::Seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables({{"w", {elements}}});
    const std::vector<float> initial = Ramp(elements, 1.0f, 0.5f);
    ASSERT_TRUE((*client)->Init({initial}).ok());
    std::vector<float> gradient(elements, 0.5f), pulled(elements, 0.0f);
    gradient[elements - 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<int64_t> versions = {0};
    std::vector<PushResponse> responses;
    absl::Status exchanged = (*client)->PushPull(versions, {gradient}, versions,
                                                 absl::Seconds(10), {pulled}, &versions,
                                                 &responses);
    EXPECT_EQ(exchanged.code(), absl::StatusCode::kInvalidArgument) << exchanged;
    EXPECT_THAT(exchanged.message(), HasSubstr("non-finite"));
    versions = {0};
    ASSERT_TRUE((*client)->Pull({0}, absl::Seconds(10), {pulled}, &versions).ok());
    EXPECT_EQ(versions[0], 0);
    EXPECT_EQ(pulled, initial);
  }
}

// A streamed pull sends the variables from their own buffers after the
// shard's lock is released, while pushes keep committing: every pulled
// model must still be exactly the one of the version it reports (copy on
// write), never a mix of two. With SGD at learning rate 1, zeros and
// gradients of ones, version v's values are all exactly -v.
TEST(ChunkStreamsTest, StreamedPullsSeeOneVersionWhilePushesCommit) {
  ServedShard served(/*workers=*/3);
  const int64_t elements = 3 * kChunkBytes / 4;  // 3 MiB: three pieces each way
  const std::vector<VariableSpec> model = {{"w", {elements}}};
  auto connect = [&](int worker) {
    auto client = PsClient::Connect({served.address()}, worker, absl::Seconds(10));
    EXPECT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables(model);
    return std::move(*client);
  };
  std::vector<float> zeros(elements, 0.0f);
  ASSERT_TRUE(connect(0)->Init({zeros}).ok());
  constexpr int kPushesPerWorker = 25;
  std::atomic<int> pushers_left{2};
  auto push = [&](int worker) {
    std::unique_ptr<PsClient> client = connect(worker);
    std::vector<float> params(elements), ones(elements, 1.0f);
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    for (int i = 0; i < kPushesPerWorker; ++i) {
      ASSERT_TRUE(client->Pull({0}, absl::Seconds(10), {params}, &versions).ok());
      ASSERT_TRUE(client->Push(versions, {ones}, &responses).ok());
    }
    --pushers_left;
  };
  std::thread first(push, 0), second(push, 1);
  std::unique_ptr<PsClient> puller = connect(2);
  std::vector<float> pulled(elements);
  std::vector<int64_t> versions;
  int pulls = 0;
  while (pushers_left.load() > 0 || pulls < 5) {
    ASSERT_TRUE(puller->Pull({0}, absl::Seconds(10), {pulled}, &versions).ok());
    ++pulls;
    const float expected = -static_cast<float>(versions[0]);
    for (int64_t i = 0; i < elements; ++i) {
      ASSERT_EQ(pulled[i], expected) << "element " << i << " of a pull at version "
                                     << versions[0] << " (pull " << pulls << ")";
    }
  }
  first.join();
  second.join();
  ASSERT_TRUE(puller->Pull({0}, absl::Seconds(10), {pulled}, &versions).ok());
  EXPECT_EQ(versions[0], 2 * kPushesPerWorker);
  EXPECT_EQ(pulled[elements - 1], -2.0f * kPushesPerWorker);
}

// Raw push streams against a shard holding "w" [3, 100] (1200 bytes).
class MalformedPushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InitRequest init;
    EncodeTensor("w", std::vector<int64_t>{3, 100}, Ramp(300, 1.0f, 1.0f), init.add_variables());
    InitResponse response;
    ASSERT_TRUE(served_.shard()->Init(init, &response).ok());
    stub_ = ParameterServer::NewStub(
        grpc::CreateChannel(served_.address(), grpc::InsecureChannelCredentials()));
    before_ = State();
  }

  // The shard's values and version, as a pull sees them.
  std::pair<int64_t, std::string> State() {
    PullRequest request;
    PullResponse response;
    EXPECT_TRUE(Pull(*served_.shard(), request, absl::Now() + absl::Seconds(5), &response).ok());
    return {response.version(), response.variables(0).data()};
  }

  static ExchangeChunk Header(std::vector<std::pair<std::string, DType>> tensors) {
    ExchangeChunk chunk;
    chunk.mutable_header()->set_worker(0);
    for (auto& [name, dtype] : tensors) {
      Tensor* t = chunk.mutable_header()->add_gradients();
      t->set_name(name);
      t->add_shape(3);
      t->add_shape(100);
      t->set_dtype(dtype);
    }
    return chunk;
  }

  static void AddPiece(ExchangeChunk* chunk, int tensor, int64_t offset, int64_t bytes) {
    TensorPiece* piece = chunk->add_pieces();
    piece->set_tensor(tensor);
    piece->set_offset(offset);
    std::vector<float> values(bytes / 4 + 1, 0.25f);
    piece->set_data(reinterpret_cast<const char*>(values.data()), bytes);
  }

  // An exchange on `context`, which gets a 10 s deadline.
  std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> OpenExchange(
      grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->Exchange(context);
  }

  // A push and pull's first message: the header and the first 800 bytes of
  // "w" (values 0.25), with a pull that needs no wait.
  ExchangeChunk FirstPushPullChunk() const {
    ExchangeChunk first = Header({{"w", FLOAT32}});
    AddPiece(&first, 0, 0, 800);
    first.mutable_pull()->set_min_version(before_.first);
    return first;
  }

  // A push alone: `chunks`, and no pull.
  grpc::Status Send(const std::vector<ExchangeChunk>& chunks) {
    return CallExchange(stub_.get(), chunks, absl::Seconds(10)).status;
  }

  ServedShard served_;
  std::unique_ptr<ParameterServer::Stub> stub_;
  std::pair<int64_t, std::string> before_;
};

// A push with no pull is answered with its outcome alone.
TEST_F(MalformedPushTest, AWellFormedPushWithNoPullIsAppliedAndAnsweredWithItsOutcome) {
  ExchangeChunk first = Header({{"w", FLOAT32}});
  AddPiece(&first, 0, 0, 800);
  ExchangeChunk second;
  AddPiece(&second, 0, 800, 400);
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {first, second});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.answers.size(), 1u);
  EXPECT_FALSE(outcome.answers[0].has_header());
  EXPECT_EQ(outcome.answers[0].pieces_size(), 0);
  ASSERT_NE(outcome.done(), nullptr);
  EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(outcome.done()->push().version(), before_.first + 1);
  EXPECT_EQ(State().first, before_.first + 1);
}

// A pull with no push: one message each way for a small model, the values
// at the shard's version, and nothing changed.
TEST_F(MalformedPushTest, APullWithNoPushAnswersTheValuesInOneMessage) {
  PullRequest pull;
  pull.add_names("w");
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {PullOnly(pull)});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.answers.size(), 1u);
  ASSERT_NE(outcome.done(), nullptr);
  EXPECT_FALSE(outcome.done()->has_push());
  EXPECT_EQ(outcome.done()->version(), before_.first);
  EXPECT_EQ(outcome.answers[0].header().variables(0).name(), "w");
  EXPECT_EQ(AnswerBytes(outcome.answers, 0), before_.second);
  EXPECT_EQ(State(), before_);
}

// A small push and pull is one message each way, as the unary call it
// replaces was: the header, the values and the outcome together.
TEST_F(MalformedPushTest, ASmallPushAndPullIsOneMessageEachWay) {
  ExchangeChunk only = Header({{"w", FLOAT32}});
  AddPiece(&only, 0, 0, 1200);
  only.mutable_pull()->set_min_version(before_.first);
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {only});
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  ASSERT_EQ(outcome.answers.size(), 1u);
  ASSERT_NE(outcome.done(), nullptr);
  EXPECT_EQ(outcome.done()->push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(outcome.done()->version(), before_.first + 1);
  EXPECT_TRUE(outcome.answers[0].has_header());
  const std::pair<int64_t, std::string> after = State();
  EXPECT_EQ(AnswerBytes(outcome.answers, 0), after.second);
}

// A first message that asks for nothing, or that is not what it claims, is
// refused with INVALID_ARGUMENT before anything is touched.
TEST_F(MalformedPushTest, AHostileFirstMessageIsRefusedAndLeavesTheModelUntouched) {
  struct Case {
    const char* name;
    ExchangeChunk first;
    const char* error;
  };
  ExchangeChunk no_header;
  no_header.mutable_pull()->add_names("w");
  ExchangeChunk both_empty;
  both_empty.mutable_header()->set_worker(0);
  ExchangeChunk pull_with_pieces = PullOnly(PullRequest());
  AddPiece(&pull_with_pieces, 0, 0, 4);
  ExchangeChunk bad_region = Header({{"w", FLOAT32}});
  bad_region.mutable_shm()->set_region(12345);
  ExchangeChunk bad_dtype = PullOnly(PullRequest());
  bad_dtype.mutable_pull()->set_dtype(static_cast<DType>(9));
  const std::vector<Case> cases = {
      {"no header", no_header, "header"},
      {"neither push nor pull", both_empty, "neither"},
      {"a pull carrying pieces", pull_with_pieces, "pieces"},
      {"an unknown wire dtype", bad_dtype, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ExchangeOutcome outcome = CallExchange(stub_.get(), {c.first});
    EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << outcome.status.error_message();
    EXPECT_THAT(outcome.status.error_message(), HasSubstr(c.error));
    EXPECT_EQ(State(), before_);
  }
  // A region the shard never attached: refused before any byte is read.
  const ExchangeOutcome outcome = CallExchange(stub_.get(), {bad_region});
  EXPECT_EQ(outcome.status.error_code(), grpc::StatusCode::NOT_FOUND)
      << outcome.status.error_message();
  EXPECT_EQ(State(), before_);
}

// On an ASYNC shard a PushPull's answer flows while the push is still
// arriving: the new values of the first chunk come back before the client
// has sent the second (if the shard waited for the whole push, the read
// below would time out).
TEST_F(MalformedPushTest, PushPullSendsValuesBackWhileThePushIsStillArriving) {
  grpc::ClientContext context;
  auto stream = OpenExchange(&context);
  ASSERT_TRUE(stream->Write(FirstPushPullChunk()));
  ExchangeAnswer answer;
  ASSERT_TRUE(stream->Read(&answer)) << "no answer before the push ended";
  ASSERT_EQ(answer.header().variables_size(), 1);
  EXPECT_EQ(answer.header().variables(0).name(), "w");
  ASSERT_EQ(answer.pieces_size(), 1);
  EXPECT_EQ(answer.pieces(0).offset(), 0);
  ASSERT_EQ(answer.pieces(0).data().size(), 800u);
  float value = 0;
  std::memcpy(&value, answer.pieces(0).data().data() + 4 * 199, 4);
  EXPECT_EQ(value, Ramp(300, 1.0f, 1.0f)[199] - 0.25f);
  EXPECT_EQ(State(), before_) << "staged values are not visible to pulls before the commit";

  ExchangeChunk second;
  AddPiece(&second, 0, 800, 400);
  ASSERT_TRUE(stream->Write(second));
  ASSERT_TRUE(stream->WritesDone());
  // The last values come with the outcome.
  ASSERT_TRUE(stream->Read(&answer));
  ASSERT_EQ(answer.pieces_size(), 1);
  EXPECT_EQ(answer.pieces(0).offset(), 800);
  EXPECT_TRUE(answer.has_done());
  EXPECT_EQ(answer.done().push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(answer.done().version(), before_.first + 1);
  EXPECT_FALSE(stream->Read(&answer));
  grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(State().first, before_.first + 1);
}

// A worker that goes away in the middle of a PushPull, while the shard is
// sending values back: nothing of its push is applied, and the shard's next
// update is not held up by it.
TEST_F(MalformedPushTest, APushPullWhoseWorkerGoesAwayMidwayIsDropped) {
  {
    grpc::ClientContext context;
    auto stream = OpenExchange(&context);
    ASSERT_TRUE(stream->Write(FirstPushPullChunk()));
    ExchangeAnswer answer;
    ASSERT_TRUE(stream->Read(&answer));  // the shard is answering
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ExchangeChunk whole = Header({{"w", FLOAT32}});
  AddPiece(&whole, 0, 0, 1200);
  const absl::Time start = absl::Now();
  grpc::Status status = Send({whole});
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "waited for the dropped update";
  EXPECT_EQ(State().first, before_.first + 1) << "the dropped push was applied too";
}

TEST_F(MalformedPushTest, IsRefusedAndLeavesTheModelUntouched) {
  struct Case {
    const char* name;
    std::vector<ExchangeChunk> chunks;
    const char* error;
    bool counted = true;  // in pushes_rejected
  };
  auto with = [](ExchangeChunk chunk, std::vector<std::array<int64_t, 3>> pieces) {
    for (auto [tensor, offset, bytes] : pieces) AddPiece(&chunk, tensor, offset, bytes);
    return chunk;
  };
  const ExchangeChunk header = Header({{"w", FLOAT32}});
  const std::vector<Case> cases = {
      {"out of order", {with(header, {{0, 400, 400}, {0, 0, 400}, {0, 800, 400}})}, "out of order"},
      {"too many bytes", {with(header, {{0, 0, 1200}, {0, 1200, 4}})}, "too many bytes"},
      {"overrunning piece", {with(header, {{0, 0, 1204}})}, "too many bytes"},
      {"missing chunks", {with(header, {{0, 0, 800}})}, "missing chunks"},
      {"no pieces at all", {header}, "missing chunks"},
      {"unknown dtype", {with(Header({{"w", static_cast<DType>(7)}}), {{0, 0, 1200}})},
       "unknown dtype"},
      {"fp16 header, fp32 bytes", {with(Header({{"w", FLOAT16}}), {{0, 0, 1200}})},
       "too many bytes"},
      {"unknown variable", {with(Header({{"v", FLOAT32}}), {{0, 0, 1200}})}, "unknown variable"},
      {"piece naming no tensor", {with(header, {{0, 0, 1200}, {1, 0, 4}})}, "names tensor 1"},
      {"no header", {with(ExchangeChunk(), {{0, 0, 1200}})}, "header"},
      {"second header", {with(header, {{0, 0, 400}}), with(header, {{0, 400, 800}})},
       "second header"},
      // Not a push at all: refused, but not counted as one.
      {"empty exchange", {}, "no header", /*counted=*/false},
  };
  int64_t rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::Status status = Send(c.chunks);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(c.error));
    EXPECT_EQ(State(), before_);
    StatsResponse stats;
    served_.shard()->Stats(&stats);
    if (c.counted) ++rejected;
    EXPECT_EQ(stats.pushes_rejected(), rejected);
  }
}

// The receiver checks pieces as it copies them in (and Push then skips its
// own pass): a non-finite value anywhere, in any wire dtype, refuses the
// push with the element named, and counts it.
TEST_F(MalformedPushTest, NonFiniteStreamedGradientIsRefused) {
  ExchangeChunk chunk = Header({{"w", FLOAT32}});
  std::vector<float> values(300, 1.0f);
  values[299] = std::numeric_limits<float>::infinity();
  TensorPiece* piece = chunk.add_pieces();
  piece->set_data(reinterpret_cast<const char*>(values.data()), 1200);
  grpc::Status status = Send({chunk});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite value (inf) at element 299"));
  EXPECT_EQ(State(), before_);

  ExchangeChunk first = Header({{"w", BFLOAT16}});
  std::vector<float> half(300, 0.5f);
  half[170] = std::numeric_limits<float>::quiet_NaN();
  std::string encoded;
  EncodeValues(half, BFLOAT16, &encoded);
  first.add_pieces()->set_data(encoded.substr(0, 300));
  ExchangeChunk second;
  second.add_pieces()->set_offset(300);
  second.mutable_pieces(0)->set_data(encoded.substr(300));
  status = Send({first, second});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite value (nan) at element 170"));
  EXPECT_EQ(State(), before_);
  StatsResponse stats;
  served_.shard()->Stats(&stats);
  EXPECT_EQ(stats.pushes_rejected(), 2);
}

// A worker that stops sending in the middle of a push that streams into the
// update (paused, or cut off without a reset) holds other updates up only
// until the stall timeout: its call is cancelled and nothing of it lands.
TEST(ChunkStreamsTest, AStalledPushStreamIsCancelledAndOtherPushesGoOn) {
  ServedShard served(/*workers=*/2, /*stalled_stream_timeout=*/absl::Milliseconds(300));
  InitRequest init;
  EncodeTensor("w", std::vector<int64_t>{3, 100}, Ramp(300, 1.0f, 1.0f), init.add_variables());
  InitResponse initialized;
  ASSERT_TRUE(served.shard()->Init(init, &initialized).ok());
  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(served.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto writer = stub->Exchange(&context);
  ExchangeChunk first;
  first.mutable_header()->set_worker(0);
  Tensor* t = first.mutable_header()->add_gradients();
  t->set_name("w");
  t->set_dtype(FLOAT32);
  std::vector<float> quarter(100, 0.25f);
  TensorPiece* piece = first.add_pieces();
  piece->set_data(reinterpret_cast<const char*>(quarter.data()), 400);
  ASSERT_TRUE(writer->Write(first));
  ASSERT_TRUE(Eventually([&] { return served.shard()->streamed_update_staged(); }))
      << "the header never reached the shard";

  const absl::Time start = absl::Now();
  PushRequest other;
  other.set_worker(1);
  EncodeTensor("w", std::vector<int64_t>{3, 100}, std::vector<float>(300, 1.0f),
               other.add_gradients());
  PushResponse response;
  ASSERT_TRUE(Push(*served.shard(), other, &response).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "held up for the stream's deadline";
  EXPECT_EQ(response.version(), 1);
  const grpc::Status stalled = writer->Finish();
  EXPECT_EQ(stalled.error_code(), grpc::StatusCode::CANCELLED) << stalled.error_message();
  PullRequest pull;
  PullResponse pulled;
  ASSERT_TRUE(Pull(*served.shard(), pull, absl::Now(), &pulled).ok());
  std::vector<float> values(300);
  DecodeTensor(pulled.variables(0), values);
  EXPECT_EQ(values, Ramp(300, 0.0f, 1.0f)) << "only the other push landed";
}

// A push that must wait for its turn (another update holds the staging)
// is parked: it holds no thread, a cancelled one is dropped with its call,
// and one still waiting is applied once the turn is free.
TEST(ChunkStreamsTest, PushesWaitingForTheirTurnHoldNoThreads) {
  ServedShard served(/*workers=*/2, /*stalled_stream_timeout=*/absl::Minutes(10));
  InitRequest init;
  EncodeTensor("w", std::vector<int64_t>{3, 100}, Ramp(300, 1.0f, 1.0f), init.add_variables());
  InitResponse initialized;
  ASSERT_TRUE(served.shard()->Init(init, &initialized).ok());
  PushRequest holder_header;
  holder_header.set_worker(0);
  Tensor* held_gradient = holder_header.add_gradients();
  held_gradient->set_name("w");
  held_gradient->set_dtype(FLOAT32);
  absl::StatusOr<ParameterShard::StreamedPush> holder =
      served.shard()->BeginStreamedPush(holder_header);
  ASSERT_TRUE(holder.ok()) << holder.status();
  ASSERT_NE(holder->update, nullptr);

  auto stub = ParameterServer::NewStub(
      grpc::CreateChannel(served.address(), grpc::InsecureChannelCredentials()));
  ExchangeChunk push;
  push.mutable_header()->set_worker(1);
  Tensor* gradient = push.mutable_header()->add_gradients();
  gradient->set_name("w");
  gradient->set_dtype(FLOAT32);
  const std::vector<float> ones(300, 1.0f);
  push.add_pieces()->set_data(reinterpret_cast<const char*>(ones.data()), 1200);
  const auto abandon_one = [&] {
    grpc::ClientContext context;
    auto stream = stub->Exchange(&context);
    EXPECT_TRUE(stream->Write(push));
    EXPECT_TRUE(Eventually([&] { return served.shard()->waiting_updates() == 1; },
                           absl::Seconds(60), absl::Microseconds(100)));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
    return Eventually([&] { return served.shard()->waiting_updates() == 0; }, absl::Seconds(60),
                      absl::Microseconds(100));
  };
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(abandon_one()) << "a cancelled wait is still there";
  const int threads_before = ThreadCount();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(abandon_one()) << "a cancelled wait is still there after " << i;
  }
  EXPECT_LE(ThreadCount(), threads_before + 2);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto waiting = stub->Exchange(&context);
  ASSERT_TRUE(waiting->Write(push));
  ASSERT_TRUE(waiting->WritesDone());
  ASSERT_TRUE(Eventually([&] { return served.shard()->waiting_updates() == 1; }));
  holder->update.reset();  // dropped, unapplied: the turn is free
  ExchangeAnswer answer;
  while (waiting->Read(&answer)) {
  }
  const grpc::Status status = waiting->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  PullRequest pull;
  PullResponse pulled;
  ASSERT_TRUE(Pull(*served.shard(), pull, absl::Now(), &pulled).ok());
  EXPECT_EQ(pulled.version(), 1);
  std::vector<float> values(300);
  DecodeTensor(pulled.variables(0), values);
  EXPECT_EQ(values, Ramp(300, 0.0f, 1.0f)) << "only the push that waited to the end landed";
}

// Init is the one call that carries a shard's whole share in one request:
// over the PS's limit, the worker is told which flag to raise.
TEST(ChunkStreamsTest, AnInitOverThePsLimitSaysWhatToRaise) {
  ShardOptions options;
  options.mode = ASYNC;
  options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
  auto shard = ParameterShard::Create(options);
  ASSERT_TRUE(shard.ok()) << shard.status();
  auto server = StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{},
                                ClusterSecurity::Plaintext(), RpcLimits{.max_request_bytes = 32 << 10});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = PsClient::Connect({absl::StrCat("127.0.0.1:", server->port)}, 0, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({{"w", {16384}}});  // 64 KiB
  const std::vector<float> zeros(16384, 0.0f);
  absl::StatusOr<bool> init = (*client)->Init({zeros});
  EXPECT_EQ(init.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(init.status().message(), HasSubstr("raise ps_server --max_message_bytes"));
  EXPECT_THAT(init.status().message(), HasSubstr("ps:0"));
  (*shard)->BeginShutdown();
  server->grpc_server->Shutdown();
}

}  // namespace
}  // namespace pst
