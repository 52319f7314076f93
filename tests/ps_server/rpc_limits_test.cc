// A hostile client against a real shard behind gRPC on 127.0.0.1: every
// RPC has a bounded cost (ps_server/rpc_limits.h). A request cannot make
// the answer many copies of the model; streams that are opened and never
// finished end at the idle deadline, within caps per worker and in total,
// and free what they held; long-polls whose client has gone give their
// thread back; calls past the thread limit are refused at once.
#include "ps_server/rpc_limits.h"

#include <chrono>
#include <climits>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps_server/ps_service.h"
#include "tests/support/eventually.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

// A field of /proc/self/status ("Threads", "VmRSS" in kB).
int64_t ProcStatus(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    std::string value = line.substr(field.size() + 1);
    value = value.substr(0, value.find(" kB"));
    int64_t number = 0;
    if (absl::SimpleAtoi(value, &number)) return number;
  }
  return -1;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

// A shard holding `variables` (name, elements), served with `limits`.
class Served {
 public:
  Served(std::vector<std::pair<std::string, int64_t>> variables, const RpcLimits& limits,
         Mode mode = ASYNC, int workers = 2) {
    ShardOptions options;
    options.mode = mode;
    options.num_workers = workers;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    shard_ = std::move(*ParameterShard::Create(options));
    InitRequest init;
    for (const auto& [name, elements] : variables) {
      EncodeTensor(name, std::vector<int64_t>{elements}, std::vector<float>(elements, 1.0f),
                   init.add_variables());
    }
    InitResponse initialized;
    EXPECT_TRUE(shard_->Init(init, &initialized).ok());
    auto running = StartGrpcServer("127.0.0.1:0", shard_.get(), AdminHooks{},
                                   ClusterSecurity::Plaintext(), limits);
    EXPECT_TRUE(running.ok()) << running.status();
    server_ = std::move(*running);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", server_.port), grpc::InsecureChannelCredentials()));
  }
  ~Served() {
    shard_->BeginShutdown();
    server_.grpc_server->Shutdown(In(absl::Seconds(2)));
  }

  ParameterServer::Stub& stub() { return *stub_; }
  ParameterShard& shard() { return *shard_; }
  const OpenStreams& streams() const { return server_.service->open_streams(); }

  // Whether the server still answers.
  bool Alive() {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(10)));
    StatsRequest request;
    StatsResponse response;
    return stub_->Stats(&context, request, &response).ok();
  }

 private:
  std::unique_ptr<ParameterShard> shard_;
  RunningServer server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

PullRequest PullOf(std::vector<std::string> names) {
  PullRequest request;
  for (std::string& name : names) request.add_names(std::move(name));
  return request;
}

grpc::Status UnaryPull(Served* served, const PullRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(30)));
  PullResponse response;
  return served->stub().Pull(&context, request, &response);
}

grpc::Status StreamedPull(Served* served, const PullRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(30)));
  auto reader = served->stub().PullStream(&context, request);
  PullChunk chunk;
  while (reader->Read(&chunk)) {
  }
  return reader->Finish();
}

// Finding 1: a Pull of a few bytes per name that names one variable many
// times made the PS build an answer of one copy per name (3000 x 4 MB
// aborted it). Names are now distinct and counted, and an answer is
// checked against the reply limit before it is built.
TEST(RpcLimitsTest, APullNamingOneVariableManyTimesIsRefusedAndTheServerStaysUp) {
  // 64 KiB named 2000 times would be a 128 MiB answer, under the default limits.
  Served served({{"w", 16 << 10}}, RpcLimits{});
  grpc::Status status = UnaryPull(&served, PullOf(std::vector<std::string>(2000, "w")));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("\"w\" twice"));
  EXPECT_TRUE(served.Alive());
  EXPECT_TRUE(UnaryPull(&served, PullOf({"w"})).ok());
}

TEST(RpcLimitsTest, PullsBeyondTheNameAndReplyLimitsAreRefused) {
  constexpr int64_t kElements = 16 << 10;  // "w": 64 KiB
  Served served({{"w", kElements}, {"v", 2 * kElements}, {"b", 4}},
                RpcLimits{.max_names_per_request = 3, .max_reply_bytes = 160 << 10});
  struct Case {
    const char* name;
    PullRequest request;
    bool streamed;
    grpc::StatusCode code;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"a name given twice, streamed", PullOf({"w", "b", "w"}), true,
       grpc::StatusCode::INVALID_ARGUMENT, "twice"},
      {"more names than allowed", PullOf({"w", "v", "b", "x"}), false,
       grpc::StatusCode::INVALID_ARGUMENT, "--max_names_per_request"},
      {"an answer over the reply limit", PullOf({"w", "v"}), false,
       grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_reply_bytes"},
      {"every variable, over the reply limit", PullOf({}), false,
       grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_reply_bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::Status status =
        c.streamed ? StreamedPull(&served, c.request) : UnaryPull(&served, c.request);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.error));
    EXPECT_TRUE(served.Alive());
  }
  // Within the limits, and streamed (which the reply limit does not bound).
  EXPECT_TRUE(UnaryPull(&served, PullOf({"w", "b"})).ok());
  EXPECT_TRUE(StreamedPull(&served, PullOf({})).ok());
}

// A PushStream's header for every variable of `served`'s "w" (elements),
// from `worker`, with no payload.
PushChunk HeaderOnly(int worker, int64_t elements) {
  PushChunk chunk;
  chunk.mutable_header()->set_worker(worker);
  Tensor* gradient = chunk.mutable_header()->add_gradients();
  gradient->set_name("w");
  gradient->add_shape(elements);
  gradient->set_dtype(FLOAT32);
  return chunk;
}

// One push stream that sends its header and then nothing.
struct AbandonedPush {
  grpc::ClientContext context;
  PushResponse response;
  std::unique_ptr<grpc::ClientWriter<PushChunk>> writer;

  AbandonedPush(ParameterServer::Stub* stub, int worker, int64_t elements,
                absl::Duration deadline) {
    context.set_deadline(In(deadline));
    writer = stub->PushStream(&context, &response);
    writer->Write(HeaderOnly(worker, elements));
  }
};

// Finding 2: push streams opened and never finished held a server thread
// and a buffer of the shard's share each, with no end (300 of them
// OOM-killed a PS limited to 1.5 GB), and the buffers stayed allocated
// after. Now the pushes being reassembled share a budget (one share per
// worker plus one, by default), every stream ends at the idle deadline
// with DEADLINE_EXCEEDED, and the memory is given back.
TEST(RpcLimitsTest, AbandonedPushStreamsEndAtTheIdleDeadlineAndFreeTheirMemory) {
  constexpr int64_t kElements = 1 << 20;  // 4 MiB: each SYNC push reassembles one share
  constexpr int kStreams = 16;
  Served served({{"w", kElements}},
                RpcLimits{.stream_idle_timeout = absl::Milliseconds(500)}, SYNC, /*workers=*/2);
  const int64_t rss_before = ProcStatus("VmRSS");
  std::vector<std::unique_ptr<AbandonedPush>> streams;
  const absl::Time opened = absl::Now();
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<AbandonedPush>(&served.stub(), i % 2, kElements,
                                                      absl::Seconds(15)));
  }
  int idle_ended = 0, refused = 0;
  for (auto& stream : streams) {
    grpc::Status status = stream->writer->Finish();
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        absl::StrContains(status.error_message(), "--stream_idle_timeout_seconds")) {
      ++idle_ended;
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(status.error_message(), HasSubstr("--max_push_buffer_bytes"));
      ++refused;
    } else {
      ADD_FAILURE() << "stream ended with " << status.error_code() << ": "
                    << status.error_message();
    }
  }
  EXPECT_LT(absl::Now() - opened, absl::Seconds(10)) << "the streams waited for the client";
  // The budget (3 shares) let three in; the others were refused at their header.
  EXPECT_EQ(idle_ended, 3);
  EXPECT_EQ(refused, kStreams - 3);
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 0; }));
  EXPECT_EQ(served.streams().push_buffer_bytes(), 0);
  // What stays is what the pool keeps for training's own pushes: a share
  // per worker plus one (12 MiB), not a share per abandoned stream (64 MiB).
  const int64_t grown_kb = ProcStatus("VmRSS") - rss_before;
  EXPECT_LT(grown_kb, 32 << 10) << "VmRSS grew by " << grown_kb << " kB";
  // Nothing of the abandoned pushes was applied, and pushes go on.
  EXPECT_EQ(served.shard().version(), 0);
  EXPECT_TRUE(served.Alive());
}

// The idle deadline covers writes too: a client that opens a pull stream
// and never reads it holds the server's Write, then loses the stream.
TEST(RpcLimitsTest, APullStreamWhoseClientNeverReadsEndsAtTheIdleDeadline) {
  constexpr int64_t kElements = 4 << 20;  // 16 MiB: more than the connection's windows
  Served served({{"w", kElements}}, RpcLimits{.stream_idle_timeout = absl::Milliseconds(300)});
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(30)));
  std::unique_ptr<grpc::ClientReader<PullChunk>> reader =
      served.stub().PullStream(&context, PullOf({}));
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 1; }));
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 0; }, absl::Seconds(10)))
      << "the server still writes to a client that does not read";
  // What it had sent is still there to read, and then the reason.
  PullChunk chunk;
  while (reader->Read(&chunk)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("--stream_idle_timeout_seconds"));
}

// Streams beyond the caps, per worker and in total, are refused at once.
TEST(RpcLimitsTest, StreamsBeyondThePerWorkerAndTotalCapsAreRefused) {
  constexpr int64_t kElements = 1024;
  Served served({{"w", kElements}},
                RpcLimits{.max_streams = 3, .max_streams_per_worker = 2,
                          .max_push_buffer_bytes = 1 << 30, .max_server_threads = 16},
                SYNC, /*workers=*/2);
  std::vector<std::unique_ptr<AbandonedPush>> open;
  for (int worker : {0, 0}) {
    open.push_back(std::make_unique<AbandonedPush>(&served.stub(), worker, kElements,
                                                   absl::Seconds(20)));
  }
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 2; }));
  {
    AbandonedPush third_of_worker_0(&served.stub(), 0, kElements, absl::Seconds(20));
    grpc::Status status = third_of_worker_0.writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--max_streams_per_worker"));
  }
  open.push_back(std::make_unique<AbandonedPush>(&served.stub(), 1, kElements, absl::Seconds(20)));
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 3; }));
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(20)));
    auto reader = served.stub().PullStream(&context, PullOf({}));
    PullChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--max_streams"));
  }
  for (auto& stream : open) stream->context.TryCancel();
  for (auto& stream : open) stream->writer->Finish();
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 0; }));
  EXPECT_TRUE(StreamedPull(&served, PullOf({})).ok()) << "a place is free again";
}

// Pulls whose wait has no end in sight, issued without a thread each.
class LongPolls {
 public:
  LongPolls(ParameterServer::Stub* stub, int count, absl::Duration deadline) {
    PullRequest request;
    request.set_min_version(int64_t{1} << 60);
    request.set_timeout_ms(INT_MAX);
    for (int i = 0; i < count; ++i) {
      calls_.push_back(std::make_unique<Call>());
      Call& call = *calls_.back();
      call.context.set_deadline(In(deadline));
      call.reader = stub->AsyncPull(&call.context, request, &queue_);
      call.reader->Finish(&call.response, &call.status, &call);
    }
  }
  ~LongPolls() {
    CancelAll();
    while (done_ < static_cast<int>(calls_.size())) Next();
  }
  void CancelAll() {
    for (auto& call : calls_) call->context.TryCancel();
  }
  // Waits for the next call to end; its status.
  grpc::Status Next() {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue_.Next(&tag, &ok));
    ++done_;
    return static_cast<Call*>(tag)->status;
  }
  int done() const { return done_; }

 private:
  struct Call {
    grpc::ClientContext context;
    PullResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<PullResponse>> reader;
  };
  grpc::CompletionQueue queue_;
  std::vector<std::unique_ptr<Call>> calls_;
  int done_ = 0;
};

// Finding 3: a long-poll cancelled by its client kept its server thread
// until its own timeout (300 such calls per round took a PS from 13 to 913
// threads in three rounds). The wait now notices the client has gone.
TEST(RpcLimitsTest, CancelledLongPollsGiveTheirThreadsBack) {
  constexpr int kPolls = 40;
  Served served({{"w", 16}}, RpcLimits{});
  ASSERT_TRUE(served.Alive());
  const int64_t baseline = ProcStatus("Threads");
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    LongPolls polls(&served.stub(), kPolls, absl::Hours(1));
    ASSERT_TRUE(Eventually([&] { return ProcStatus("Threads") >= baseline + kPolls; }))
        << "the pulls are not all waiting: " << ProcStatus("Threads") << " threads";
    polls.CancelAll();
    for (int i = 0; i < kPolls; ++i) {
      EXPECT_EQ(polls.Next().error_code(), grpc::StatusCode::CANCELLED);
    }
    EXPECT_TRUE(Eventually([&] { return ProcStatus("Threads") <= baseline + 4; },
                           absl::Seconds(10)))
        << ProcStatus("Threads") << " threads, " << baseline << " before the pulls";
  }
  EXPECT_TRUE(served.Alive());
}

// timeout_ms is cut to --max_pull_wait_seconds.
TEST(RpcLimitsTest, APullWaitsNoLongerThanTheLimit) {
  Served served({{"w", 16}}, RpcLimits{.max_pull_wait = absl::Milliseconds(300)});
  PullRequest request;
  request.set_min_version(1000);
  request.set_timeout_ms(INT_MAX);
  const absl::Time start = absl::Now();
  grpc::Status status = UnaryPull(&served, request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("did not arrive in time"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

grpc::Status AwaitWorkersDone(Served* served, int32_t timeout_ms, int64_t known_changes,
                              absl::Duration call_deadline, StatsResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(In(call_deadline));
  AwaitWorkersDoneRequest request;
  request.set_timeout_ms(timeout_ms);
  request.set_known_changes(known_changes);
  return served->stub().AwaitWorkersDone(&context, request, response);
}

// The chief's long-poll is held to what a Pull is: bad input is refused,
// and its wait is cut to --max_pull_wait_seconds, answering the state then.
TEST(RpcLimitsTest, AwaitWorkersDoneIsValidatedAndWaitsNoLongerThanTheLimit) {
  Served served({{"w", 16}}, RpcLimits{.max_pull_wait = absl::Milliseconds(300)});
  StatsResponse response;
  grpc::Status status = AwaitWorkersDone(&served, -1, 0, absl::Seconds(30), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  status = AwaitWorkersDone(&served, 10, -7, absl::Seconds(30), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();

  ASSERT_TRUE(AwaitWorkersDone(&served, 0, -1, absl::Seconds(30), &response).ok());
  const int64_t changes = response.worker_changes();
  const absl::Time start = absl::Now();
  status = AwaitWorkersDone(&served, INT_MAX, changes, absl::Minutes(10), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.worker_changes(), changes);
  EXPECT_EQ(response.workers_done(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A call's deadline bounds the wait whatever its timeout_ms: the parked
// thread goes back when the client stops waiting.
TEST(RpcLimitsTest, AwaitWorkersDoneGivesItsThreadBackAtTheCallsDeadline) {
  Served served({{"w", 16}}, RpcLimits{});
  StatsResponse response;
  ASSERT_TRUE(AwaitWorkersDone(&served, 0, -1, absl::Seconds(30), &response).ok());
  const int64_t changes = response.worker_changes();
  grpc::Status status;
  std::thread chief([&] {
    StatsResponse answer;
    status = AwaitWorkersDone(&served, INT_MAX, changes, absl::Seconds(3), &answer);
  });
  EXPECT_TRUE(Eventually([&] { return served.shard().waiting_done_calls() == 1; }))
      << "the call never waited";
  chief.join();
  // The server ends its wait at the call's deadline and answers OK with the
  // state then, unless the client's own deadline fires first.
  EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
      << status.error_code() << ": " << status.error_message();
  EXPECT_TRUE(
      Eventually([&] { return served.shard().waiting_done_calls() == 0; }, absl::Seconds(10)))
      << "the server still waits for a client that has stopped";
  EXPECT_TRUE(served.Alive());
}

// The server's threads are bounded; a call past them is refused at once
// with RESOURCE_EXHAUSTED rather than given one more thread.
TEST(RpcLimitsTest, CallsBeyondTheThreadLimitAreRefusedAtOnce) {
  constexpr int kThreads = 16;
  constexpr int kPolls = 40;
  Served served({{"w", 16}}, RpcLimits{.max_streams = 4, .max_server_threads = kThreads});
  ASSERT_TRUE(served.Alive());
  const int64_t baseline = ProcStatus("Threads");
  LongPolls polls(&served.stub(), kPolls, absl::Seconds(30));
  // All but the threads' worth end at once, refused.
  for (int i = 0; i < kPolls - kThreads; ++i) {
    grpc::Status status = polls.Next();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
  }
  EXPECT_LE(ProcStatus("Threads"), baseline + kThreads);
}

}  // namespace
}  // namespace pst
