// The data plane's one call, Exchange, end to end over loopback gRPC:
// PsClient streams a model larger than one chunk to a real shard and back,
// bit for bit; a pull is an exchange with no push, a push one with no pull;
// and a shard refuses malformed exchanges with INVALID_ARGUMENT, leaving
// the model as it was.
#include "ps_server/service/chunk_streams.h"

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
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/support/thread_count.h"
#include "worker/client/ps_client.h"
#include "tests/ps_server/service/chunk_streams_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace chunk_streams_testing;  // NOLINT(build/namespaces)

using ::testing::HasSubstr;

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
    ASSERT_TRUE(
        (*client)
            ->Exchange(
                {.min_versions = {0}, .timeout = absl::Seconds(10), .values = buffers.pulled_spans},
                &versions, nullptr)
            .ok());
    EXPECT_TRUE(buffers.PulledAfter(0));
    std::vector<PushResponse> responses;
    absl::Status pushed = (*client)->Exchange(
        {.computed_at = versions, .gradients = buffers.gradient_spans}, nullptr, &responses);
    ASSERT_TRUE(pushed.ok()) << pushed;
    EXPECT_EQ(responses[0].outcome(), PushResponse::APPLIED);
    ASSERT_TRUE(
        (*client)
            ->Exchange(
                {.min_versions = {1}, .timeout = absl::Seconds(10), .values = buffers.pulled_spans},
                &versions, nullptr)
            .ok());
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
        absl::Status exchanged = (*client)->Exchange({.computed_at = versions,
                                                      .gradients = buffers.gradient_spans,
                                                      .min_versions = min_versions,
                                                      .timeout = absl::Seconds(10),
                                                      .values = buffers.pulled_spans},
                                                     &versions, &responses);
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
    results[worker] = client->Exchange({.computed_at = versions[worker],
                                        .gradients = {grads[0], grads[1]},
                                        .min_versions = /*min_versions=*/{1, 1},
                                        .timeout = absl::Seconds(10),
                                        .values = {pulled[worker][0], pulled[worker][1]}},
                                       &versions[worker], &responses[worker]);
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
    absl::Status exchanged = (*client)->Exchange({.computed_at = versions,
                                                  .gradients = {gradient},
                                                  .min_versions = versions,
                                                  .timeout = absl::Seconds(10),
                                                  .values = {pulled}},
                                                 &versions, &responses);
    EXPECT_EQ(exchanged.code(), absl::StatusCode::kInvalidArgument) << exchanged;
    EXPECT_THAT(exchanged.message(), HasSubstr("non-finite"));
    versions = {0};
    ASSERT_TRUE(
        (*client)
            ->Exchange({.min_versions = {0}, .timeout = absl::Seconds(10), .values = {pulled}},
                       &versions, nullptr)
            .ok());
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
      ASSERT_TRUE(
          client
              ->Exchange({.min_versions = {0}, .timeout = absl::Seconds(10), .values = {params}},
                         &versions, nullptr)
              .ok());
      ASSERT_TRUE(
          client->Exchange({.computed_at = versions, .gradients = {ones}}, nullptr, &responses)
              .ok());
    }
    --pushers_left;
  };
  std::thread first(push, 0), second(push, 1);
  std::unique_ptr<PsClient> puller = connect(2);
  std::vector<float> pulled(elements);
  std::vector<int64_t> versions;
  int pulls = 0;
  while (pushers_left.load() > 0 || pulls < 5) {
    ASSERT_TRUE(
        puller
            ->Exchange({.min_versions = {0}, .timeout = absl::Seconds(10), .values = {pulled}},
                       &versions, nullptr)
            .ok());
    ++pulls;
    const float expected = -static_cast<float>(versions[0]);
    for (int64_t i = 0; i < elements; ++i) {
      ASSERT_EQ(pulled[i], expected) << "element " << i << " of a pull at version "
                                     << versions[0] << " (pull " << pulls << ")";
    }
  }
  first.join();
  second.join();
  ASSERT_TRUE(
      puller
          ->Exchange({.min_versions = {0}, .timeout = absl::Seconds(10), .values = {pulled}},
                     &versions, nullptr)
          .ok());
  EXPECT_EQ(versions[0], 2 * kPushesPerWorker);
  EXPECT_EQ(pulled[elements - 1], -2.0f * kPushesPerWorker);
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

}  // namespace PST_FILE_ID
}  // namespace pst
