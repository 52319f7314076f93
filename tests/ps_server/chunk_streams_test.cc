// The chunked data plane end to end over loopback gRPC: PsClient streams a
// model larger than one chunk to a real shard and back, bit for bit, and a
// shard refuses malformed push streams with INVALID_ARGUMENT, leaving the
// model as it was.
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
#include "tests/support/eventually.h"
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
// are streamed (PushPull) and shares of one message (PushPullSmall), whose
// handler waits for the step inside the unary call.
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
    EXPECT_TRUE(served_.shard()->Pull(request, absl::Now() + absl::Seconds(5), &response).ok());
    return {response.version(), response.variables(0).data()};
  }

  static PushChunk Header(std::vector<std::pair<std::string, DType>> tensors) {
    PushChunk chunk;
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

  static void AddPiece(PushChunk* chunk, int tensor, int64_t offset, int64_t bytes) {
    TensorPiece* piece = chunk->add_pieces();
    piece->set_tensor(tensor);
    piece->set_offset(offset);
    std::vector<float> values(bytes / 4 + 1, 0.25f);
    piece->set_data(reinterpret_cast<const char*>(values.data()), bytes);
  }

  // A PushPull call on `context`, which gets a 10 s deadline.
  std::unique_ptr<grpc::ClientReaderWriter<PushChunk, PushPullChunk>> OpenPushPull(
      grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->PushPull(context);
  }

  // A PushPull's first message: the header and the first 800 bytes of "w"
  // (values 0.25), with a pull that needs no wait.
  PushChunk FirstPushPullChunk() const {
    PushChunk first = Header({{"w", FLOAT32}});
    AddPiece(&first, 0, 0, 800);
    first.mutable_pull()->set_min_version(before_.first);
    return first;
  }

  grpc::Status Send(const std::vector<PushChunk>& chunks) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    PushResponse response;
    auto writer = stub_->PushStream(&context, &response);
    for (const PushChunk& chunk : chunks) {
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  ServedShard served_;
  std::unique_ptr<ParameterServer::Stub> stub_;
  std::pair<int64_t, std::string> before_;
};

TEST_F(MalformedPushTest, AWellFormedStreamIsApplied) {
  PushChunk first = Header({{"w", FLOAT32}});
  AddPiece(&first, 0, 0, 800);
  PushChunk second;
  AddPiece(&second, 0, 800, 400);
  grpc::Status status = Send({first, second});
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(State().first, before_.first + 1);
}

// On an ASYNC shard a PushPull's answer flows while the push is still
// arriving: the new values of the first chunk come back before the client
// has sent the second (if the shard waited for the whole push, the read
// below would time out).
TEST_F(MalformedPushTest, PushPullSendsValuesBackWhileThePushIsStillArriving) {
  grpc::ClientContext context;
  auto stream = OpenPushPull(&context);
  ASSERT_TRUE(stream->Write(FirstPushPullChunk()));
  PushPullChunk answer;
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

  PushChunk second;
  AddPiece(&second, 0, 800, 400);
  ASSERT_TRUE(stream->Write(second));
  ASSERT_TRUE(stream->WritesDone());
  ASSERT_TRUE(stream->Read(&answer));
  ASSERT_EQ(answer.pieces_size(), 1);
  EXPECT_EQ(answer.pieces(0).offset(), 800);
  ASSERT_TRUE(stream->Read(&answer));
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
    auto stream = OpenPushPull(&context);
    ASSERT_TRUE(stream->Write(FirstPushPullChunk()));
    PushPullChunk answer;
    ASSERT_TRUE(stream->Read(&answer));  // the shard is answering
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  PushChunk whole = Header({{"w", FLOAT32}});
  AddPiece(&whole, 0, 0, 1200);
  const absl::Time start = absl::Now();
  grpc::Status status = Send({whole});
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << "waited for the dropped update";
  EXPECT_EQ(State().first, before_.first + 1) << "the dropped push was applied too";
}

TEST_F(MalformedPushTest, APushPullWithoutItsPullIsRefused) {
  grpc::ClientContext context;
  auto stream = OpenPushPull(&context);
  PushChunk only = Header({{"w", FLOAT32}});
  AddPiece(&only, 0, 0, 1200);
  stream->Write(only);
  stream->WritesDone();
  PushPullChunk answer;
  EXPECT_FALSE(stream->Read(&answer));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("PullRequest"));
  EXPECT_EQ(State(), before_);
}

TEST_F(MalformedPushTest, IsRefusedAndLeavesTheModelUntouched) {
  struct Case {
    const char* name;
    std::vector<PushChunk> chunks;
    const char* error;
  };
  auto with = [](PushChunk chunk, std::vector<std::array<int64_t, 3>> pieces) {
    for (auto [tensor, offset, bytes] : pieces) AddPiece(&chunk, tensor, offset, bytes);
    return chunk;
  };
  const PushChunk header = Header({{"w", FLOAT32}});
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
      {"no header", {with(PushChunk(), {{0, 0, 1200}})}, "header"},
      {"second header", {with(header, {{0, 0, 400}}), with(header, {{0, 400, 800}})},
       "second header"},
      {"empty stream", {}, "no header"},
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
    EXPECT_EQ(stats.pushes_rejected(), ++rejected);
  }
}

// The receiver checks pieces as it copies them in (and Push then skips its
// own pass): a non-finite value anywhere, in any wire dtype, refuses the
// push with the element named, and counts it.
TEST_F(MalformedPushTest, NonFiniteStreamedGradientIsRefused) {
  PushChunk chunk = Header({{"w", FLOAT32}});
  std::vector<float> values(300, 1.0f);
  values[299] = std::numeric_limits<float>::infinity();
  TensorPiece* piece = chunk.add_pieces();
  piece->set_data(reinterpret_cast<const char*>(values.data()), 1200);
  grpc::Status status = Send({chunk});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("non-finite value (inf) at element 299"));
  EXPECT_EQ(State(), before_);

  PushChunk first = Header({{"w", BFLOAT16}});
  std::vector<float> half(300, 0.5f);
  half[170] = std::numeric_limits<float>::quiet_NaN();
  std::string encoded;
  EncodeValues(half, BFLOAT16, &encoded);
  first.add_pieces()->set_data(encoded.substr(0, 300));
  PushChunk second;
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
  PushResponse stalled_response;
  auto writer = stub->PushStream(&context, &stalled_response);
  PushChunk first;
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
  ASSERT_TRUE(served.shard()->Push(other, &response).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "held up for the stream's deadline";
  EXPECT_EQ(response.version(), 1);
  const grpc::Status stalled = writer->Finish();
  EXPECT_EQ(stalled.error_code(), grpc::StatusCode::CANCELLED) << stalled.error_message();
  PullRequest pull;
  PullResponse pulled;
  ASSERT_TRUE(served.shard()->Pull(pull, absl::Now(), &pulled).ok());
  std::vector<float> values(300);
  DecodeTensor(pulled.variables(0), values);
  EXPECT_EQ(values, Ramp(300, 0.0f, 1.0f)) << "only the other push landed";
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
