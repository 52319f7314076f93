// A hostile client against a real shard behind gRPC on 127.0.0.1: every
// RPC has a bounded cost (ps_server/rpc_limits.h). A request cannot make
// the answer many copies of the model; exchanges that are opened and never
// finished end at the idle deadline, within caps per worker and in total,
// and free what they held; long-polls hold no thread while they wait, and
// those whose client has gone drop their waiter; unary calls past the
// thread limit are refused at once.
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
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "gtest/gtest.h"
#include "ps_server/ps_service.h"
#include "ps_server/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"

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

// A shard holding `variables` (name, elements), served with `limits`; none:
// a shard still waiting for its Init.
class Served {
 public:
  Served(std::vector<std::pair<std::string, int64_t>> variables, const RpcLimits& limits,
         Mode mode = ASYNC, int workers = 2, AdminHooks hooks = {}) {
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
    if (!variables.empty()) {
      EXPECT_TRUE(shard_->Init(init, &initialized).ok());
    }
    auto running = StartGrpcServer("127.0.0.1:0", shard_.get(), std::move(hooks),
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
  int port() const { return server_.port; }
  const OpenStreams& streams() const { return server_.service->open_streams(); }
  int open_connections() { return server_.gate->open_connections(); }

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

// An Init as raw bytes, sent as they are: grpc's status and the answer.
std::pair<grpc::Status, InitResponse> RawInit(Served* served, const std::string& bytes) {
  grpc::GenericStub stub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", served->port()),
                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(20)));
  grpc::Slice payload(bytes);
  grpc::ByteBuffer request(&payload, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/pst.ParameterServer/Init", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status call_status) {
                   status = std::move(call_status);
                   done.Notify();
                 });
  done.WaitForNotification();
  InitResponse answer;
  if (status.ok()) {
    EXPECT_TRUE(grpc::SerializationTraits<InitResponse>::Deserialize(&response, &answer).ok());
  }
  return {status, answer};
}

PullRequest PullOf(std::vector<std::string> names) {
  PullRequest request;
  for (std::string& name : names) request.add_names(std::move(name));
  return request;
}

// A pull alone, as an exchange.
grpc::Status ExchangePull(Served* served, const PullRequest& request) {
  return CallExchange(&served->stub(), {PullOnly(request)}).status;
}

PullRequest InDType(PullRequest request, DType dtype) {
  request.set_dtype(dtype);
  return request;
}

// Hostile: Inits of a million tiny tensors, sent in a loop, were parsed on
// the queue thread before anything was checked, and slowed a SYNC job
// 22-fold. An Init reaching an initialized shard now has only its worker
// read: its variables here are bytes no parser accepts, and it is still
// answered, with accepted false, the model untouched. Only a shard that
// waits for its model parses one (on a work thread), and refuses these.
TEST(RpcLimitsTest, AnInitToAnInitializedShardIsAnsweredWithoutParsingItsVariables) {
  // worker 1; variables: one entry of 3 bytes that frame no Tensor.
  const std::string unparsable("\x08\x01\x12\x03\xff\xff\xff", 7);
  Served initialized({{"w", 4}}, RpcLimits{});
  const auto [status, answer] = RawInit(&initialized, unparsable);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(answer.accepted());
  StatsResponse stats;
  initialized.shard().Stats(&stats);
  EXPECT_EQ(stats.pushes_rejected(), 0);
  EXPECT_EQ(stats.parameter_bytes(), 16);

  Served waiting({}, RpcLimits{});
  const auto [refused, unused] = RawInit(&waiting, unparsable);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("not a valid InitRequest"));
  EXPECT_FALSE(waiting.shard().initialized());
  InitRequest init;
  init.set_worker(1);
  EncodeTensor("w", std::vector<int64_t>{4}, std::vector<float>(4, 1.0f), init.add_variables());
  const auto [accepted, first] = RawInit(&waiting, init.SerializeAsString());
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_TRUE(first.accepted());
  EXPECT_TRUE(waiting.shard().initialized());
}

TEST(RpcLimitsTest, AnInitWhoseBytesDoNotFrameAsAMessageIsRefused) {
  Served served({{"w", 4}}, RpcLimits{});
  // variables claims 5 bytes and 2 follow; then a tag with field number 0.
  for (const std::string& bytes :
       {std::string("\x08\x01\x12\x05" "ab", 5), std::string("\x08\x01\x00", 3)}) {
    const auto [status, answer] = RawInit(&served, bytes);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("not a protobuf message"));
  }
  EXPECT_TRUE(served.Alive());
}

// Finding 1: a Pull of a few bytes per name that names one variable many
// times made the PS build an answer of one copy per name (3000 x 4 MB
// aborted it). Names are now distinct and counted, and an answer is
// checked against the reply limit before it is built.
TEST(RpcLimitsTest, APullNamingOneVariableManyTimesIsRefusedAndTheServerStaysUp) {
  // 64 KiB named 2000 times would be a 128 MiB answer, under the default limits.
  Served served({{"w", 16 << 10}}, RpcLimits{});
  grpc::Status status = ExchangePull(&served, PullOf(std::vector<std::string>(2000, "w")));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("\"w\" twice"));
  EXPECT_TRUE(served.Alive());
  EXPECT_TRUE(ExchangePull(&served, PullOf({"w"})).ok());
}

TEST(RpcLimitsTest, PullsBeyondTheNameAndReplyLimitsAreRefused) {
  constexpr int64_t kElements = 16 << 10;  // "w": 64 KiB
  Served served({{"w", kElements}, {"v", 2 * kElements}, {"b", 4}},
                RpcLimits{.max_names_per_request = 3, .max_reply_bytes = 80 << 10});
  struct Case {
    const char* name;
    PullRequest request;
    grpc::StatusCode code;
    const char* error;
  };
  // The reply limit bounds what the PS encodes for an answer: a 16-bit one.
  const std::vector<Case> cases = {
      {"a name given twice", PullOf({"w", "b", "w"}), grpc::StatusCode::INVALID_ARGUMENT, "twice"},
      {"more names than allowed", PullOf({"w", "v", "b", "x"}),
       grpc::StatusCode::INVALID_ARGUMENT, "--max_names_per_request"},
      {"an encoded answer over the reply limit", InDType(PullOf({"w", "v"}), BFLOAT16),
       grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_reply_bytes"},
      {"every variable, encoded, over the reply limit", InDType(PullOf({}), FLOAT16),
       grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_reply_bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    grpc::Status status = ExchangePull(&served, c.request);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.error));
    EXPECT_TRUE(served.Alive());
  }
  // Within the limits, and in float32 (sent from the variables' own
  // buffers, which the reply limit does not bound).
  EXPECT_TRUE(ExchangePull(&served, InDType(PullOf({"w", "b"}), BFLOAT16)).ok());
  EXPECT_TRUE(ExchangePull(&served, PullOf({})).ok());
}

// An exchange's header pushing every variable of `served`'s "w"
// (elements), from `worker`, with no payload.
ExchangeChunk HeaderOnly(int worker, int64_t elements) {
  ExchangeChunk chunk;
  chunk.mutable_header()->set_worker(worker);
  Tensor* gradient = chunk.mutable_header()->add_gradients();
  gradient->set_name("w");
  gradient->add_shape(elements);
  gradient->set_dtype(FLOAT32);
  return chunk;
}

// One exchange that sends its push's header and then nothing.
struct AbandonedPush {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> writer;

  AbandonedPush(ParameterServer::Stub* stub, int worker, int64_t elements,
                absl::Duration deadline) {
    context.set_deadline(In(deadline));
    writer = stub->Exchange(&context);
    writer->Write(HeaderOnly(worker, elements));
  }
};

// Finding 2: push streams opened and never finished held a server thread
// and a buffer of the shard's share each (they were sync-API calls then), with no end (300 of them
// OOM-killed a PS limited to 1.5 GB), and the buffers stayed allocated
// after. Now the pushes being reassembled share a budget (one share per
// worker plus one, by default), every stream ends at the idle deadline
// with DEADLINE_EXCEEDED, and the memory is given back.
TEST(RpcLimitsTest, AbandonedPushStreamsEndAtTheIdleDeadlineAndFreeTheirMemory) {
  constexpr int64_t kElements = 1 << 20;  // 4 MiB: each SYNC push reassembles one share
  constexpr int kStreams = 16;
  // No minimum rate: a silent push would race the idle deadline to end it.
  Served served({{"w", kElements}},
                RpcLimits{.stream_idle_timeout = absl::Milliseconds(500),
                          .min_push_bytes_per_second = 0},
                SYNC, /*workers=*/2);
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

// Second round: three push streams dripping 4 bytes every 10 s held the
// push budget for good, never idle long enough for the idle timeout, and
// workers were refused. A push holding budget now has to arrive at a
// minimum rate over each idle-timeout window, or it ends and gives the
// budget back.
TEST(RpcLimitsTest, APushDrippingBytesIsEndedForItsRateAndGivesTheBudgetBack) {
  constexpr int64_t kElements = 1 << 20;
  Served served({{"w", kElements}},
                RpcLimits{.stream_idle_timeout = absl::Milliseconds(500),
                          .min_push_bytes_per_second = 1 << 20},
                SYNC, /*workers=*/2);
  AbandonedPush drip(&served.stub(), 0, kElements, absl::Seconds(60));
  const absl::Time opened = absl::Now();
  // Four bytes a piece, a piece every 50 ms: never idle for the timeout.
  // The pause is the hostile client's pace, not a wait for the server.
  bool ended = false;
  for (int i = 0; i < 200 && !ended; ++i) {
    ExchangeChunk piece;
    TensorPiece* bytes = piece.add_pieces();
    bytes->set_tensor(0);
    bytes->set_offset(4 * i);
    bytes->set_data(std::string(4, '\0'));
    ended = !drip.writer->Write(piece);
    if (!ended) absl::SleepFor(absl::Milliseconds(50));
  }
  const grpc::Status status = drip.writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("--min_push_bytes_per_second"));
  EXPECT_LT(absl::Now() - opened, absl::Seconds(8)) << "the drip held its budget too long";
  ASSERT_TRUE(Eventually([&] { return served.streams().push_buffer_bytes() == 0; }));
  EXPECT_EQ(served.shard().version(), 0);
  EXPECT_TRUE(served.Alive());
}

// The idle deadline covers writes too: a client that opens a pull and
// never reads its answer holds the server's write, then loses the call.
TEST(RpcLimitsTest, APullWhoseClientNeverReadsEndsAtTheIdleDeadline) {
  constexpr int64_t kElements = 4 << 20;  // 16 MiB: more than the connection's windows
  Served served({{"w", kElements}}, RpcLimits{.stream_idle_timeout = absl::Milliseconds(300)});
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(30)));
  std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> reader =
      served.stub().Exchange(&context);
  ASSERT_TRUE(reader->Write(PullOnly(PullOf({}))));
  ASSERT_TRUE(reader->WritesDone());
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 1; }));
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 0; }, absl::Seconds(10)))
      << "the server still writes to a client that does not read";
  // What it had sent is still there to read, and then the reason.
  ExchangeAnswer chunk;
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
    auto reader = served.stub().Exchange(&context);
    reader->Write(PullOnly(PullOf({})));
    reader->WritesDone();
    ExchangeAnswer chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--max_streams"));
  }
  for (auto& stream : open) stream->context.TryCancel();
  for (auto& stream : open) stream->writer->Finish();
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 0; }));
  EXPECT_TRUE(ExchangePull(&served, PullOf({})).ok()) << "a place is free again";
}

// Exchanges that never send their header cannot keep the workers out: an
// arrival beyond the cap on such exchanges ends the oldest of them, and
// only exchanges that have named their worker count against --max_streams.
TEST(RpcLimitsTest, ExchangesThatNeverNameAWorkerCannotCrowdOutTheWorkers) {
  constexpr int kCap = 4;
  Served served({{"w", 16}}, RpcLimits{.max_streams = kCap, .max_server_threads = 4});
  struct Headerless {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>> stream;
  };
  std::vector<std::unique_ptr<Headerless>> silent;
  for (int i = 0; i < 3 * kCap; ++i) {
    silent.push_back(std::make_unique<Headerless>());
    silent.back()->context.set_deadline(In(absl::Seconds(60)));
    silent.back()->stream = served.stub().Exchange(&silent.back()->context);
    // Each is admitted (beyond the cap: has displaced one) before the next
    // opens, so the oldest are the ones displaced.
    ASSERT_TRUE(Eventually([&] {
      return served.streams().unnamed() == std::min(i + 1, kCap) &&
             served.streams().refused() == std::max(0, i + 1 - kCap);
    })) << served.streams().unnamed() << " unnamed, " << served.streams().refused()
        << " displaced after opening " << i + 1;
  }
  for (int i = 0; i < 2 * kCap; ++i) {
    grpc::Status status = silent[i]->stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << i;
    EXPECT_THAT(status.error_message(), HasSubstr("had not named its worker"));
  }
  EXPECT_EQ(served.streams().unnamed(), kCap);
  // A worker's exchanges, up to its own cap, are served beside them.
  for (int i = 0; i < kCap; ++i) {
    EXPECT_TRUE(ExchangePull(&served, PullOf({})).ok()) << "pull " << i;
  }
  for (int i = 2 * kCap; i < 3 * kCap; ++i) silent[i]->context.TryCancel();
  for (int i = 2 * kCap; i < 3 * kCap; ++i) silent[i]->stream->Finish();
  ASSERT_TRUE(Eventually([&] { return served.streams().open() == 0; }));
  EXPECT_TRUE(served.Alive());
}

// Second hostile pass: 20 000 idle connections held the PS's connection
// caps for good, and real workers could not connect. A connection with no
// call open for --connection_idle_timeout_seconds is closed; its client
// connects again at its next call.
TEST(RpcLimitsTest, AnIdleConnectionIsClosedAndItsClientConnectsAgain) {
  Served served({{"w", 16}},
                RpcLimits{.connection_idle_timeout = absl::Milliseconds(500)});
  ASSERT_TRUE(served.Alive());
  EXPECT_EQ(served.open_connections(), 1);
  EXPECT_TRUE(Eventually([&] { return served.open_connections() == 0; }, absl::Seconds(30)))
      << "the idle connection is still open";
  EXPECT_TRUE(served.Alive()) << "the client did not connect again";
}

// Pulls (exchanges) that wait for `min_version`, issued on gRPC's callback
// API (a test client; its speed does not matter): no client thread each.
class LongPolls {
 public:
  LongPolls(ParameterServer::Stub* stub, int count, absl::Duration deadline,
            int64_t min_version = int64_t{1} << 60) {
    PullRequest request;
    request.set_min_version(min_version);
    request.set_timeout_ms(INT_MAX);
    first_ = PullOnly(request);
    for (int i = 0; i < count; ++i) {
      calls_.push_back(std::make_unique<Call>(this));
      Call& call = *calls_.back();
      call.context.set_deadline(In(deadline));
      stub->async()->Exchange(&call.context, &call);
      call.StartWriteLast(&first_, grpc::WriteOptions());
      call.StartRead(&call.answer);
      call.StartCall();
    }
  }
  ~LongPolls() {
    CancelAll();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](LongPolls* polls) { return polls->ended_ == static_cast<int>(polls->calls_.size()); },
        this));
  }
  void CancelAll() {
    for (auto& call : calls_) call->context.TryCancel();
  }
  // Waits for the next call to end; its status.
  grpc::Status Next() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](LongPolls* polls) { return polls->ended_ > polls->taken_; }, this));
    return calls_[order_[taken_++]]->status;
  }

 private:
  struct Call final : grpc::ClientBidiReactor<ExchangeChunk, ExchangeAnswer> {
    explicit Call(LongPolls* polls) : polls(polls) {}
    void OnReadDone(bool ok) override {
      if (ok) StartRead(&answer);
    }
    void OnDone(const grpc::Status& s) override {
      absl::MutexLock lock(&polls->mu_);
      status = s;
      for (size_t i = 0; i < polls->calls_.size(); ++i) {
        if (polls->calls_[i].get() == this) polls->order_.push_back(i);
      }
      ++polls->ended_;
    }
    LongPolls* const polls;
    grpc::ClientContext context;
    ExchangeAnswer answer;
    grpc::Status status;
  };
  ExchangeChunk first_;
  std::vector<std::unique_ptr<Call>> calls_;
  absl::Mutex mu_;
  std::vector<size_t> order_;  // calls, in the order they ended
  int ended_ = 0;
  int taken_ = 0;
};

// Finding 3: a long-poll cancelled by its client kept its server thread
// until its own timeout (300 such calls per round took a PS from 13 to 913
// threads in three rounds). A waiting pull now holds no thread at all, and
// one whose client has gone drops its waiter at once.
TEST(RpcLimitsTest, LongPollsHoldNoThreadAndCancelledOnesDropTheirWaiters) {
  constexpr int kPolls = 40;
  // One worker's pulls: its cap on open exchanges is raised to let them all in.
  Served served({{"w", 16}}, RpcLimits{.max_streams_per_worker = kPolls});
  ASSERT_TRUE(served.Alive());
  const int64_t baseline = ProcStatus("Threads");
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    LongPolls polls(&served.stub(), kPolls, absl::Hours(1));
    ASSERT_TRUE(Eventually([&] { return served.shard().waiting_pulls() == kPolls; }))
        << "the pulls are not all waiting: " << served.shard().waiting_pulls();
    EXPECT_LE(ProcStatus("Threads"), baseline + 8) << "the waiting pulls hold threads";
    polls.CancelAll();
    for (int i = 0; i < kPolls; ++i) {
      EXPECT_EQ(polls.Next().error_code(), grpc::StatusCode::CANCELLED);
    }
    EXPECT_TRUE(Eventually([&] { return served.shard().waiting_pulls() == 0; }))
        << served.shard().waiting_pulls() << " waiters left behind";
    EXPECT_TRUE(Eventually([&] { return served.streams().open() == 0; }))
        << served.streams().open() << " exchanges still open";
  }
  EXPECT_TRUE(served.Alive());
}

// More pulls wait than the server has threads, and every one is answered
// when the version they wait for arrives.
TEST(RpcLimitsTest, MorePullsWaitThanTheServerHasThreadsAndAllAreAnswered) {
  constexpr int kThreads = 16;
  constexpr int kPolls = 48;
  Served served({{"w", 16}}, RpcLimits{.max_streams = kPolls, .max_streams_per_worker = kPolls,
                                      .max_server_threads = kThreads});
  LongPolls polls(&served.stub(), kPolls, absl::Seconds(60), /*min_version=*/1);
  ASSERT_TRUE(Eventually([&] { return served.shard().waiting_pulls() == kPolls; }))
      << "the pulls are not all waiting: " << served.shard().waiting_pulls();
  PushRequest push;
  push.set_worker(0);
  EncodeTensor("w", std::vector<int64_t>{16}, std::vector<float>(16, 0.5f), push.add_gradients());
  PushResponse pushed;
  ASSERT_TRUE(Push(served.shard(), push, &pushed).ok());
  for (int i = 0; i < kPolls; ++i) {
    const grpc::Status status = polls.Next();
    EXPECT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  }
  EXPECT_EQ(served.shard().waiting_pulls(), 0);
}

// timeout_ms is cut to --max_pull_wait_seconds.
TEST(RpcLimitsTest, APullWaitsNoLongerThanTheLimit) {
  Served served({{"w", 16}}, RpcLimits{.max_pull_wait = absl::Milliseconds(300)});
  PullRequest request;
  request.set_min_version(1000);
  request.set_timeout_ms(INT_MAX);
  const absl::Time start = absl::Now();
  grpc::Status status = ExchangePull(&served, request);
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

// A call's deadline bounds the wait whatever its timeout_ms: the waiter
// goes when the client stops waiting.
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

// Second hostile pass: 10 000 waiting AwaitWorkersDone calls cost the PS
// memory and every step a look at each. Only --max_streams may wait.
TEST(RpcLimitsTest, AwaitWorkersDoneCallsBeyondTheCapAreRefused) {
  constexpr int kCap = 2;
  Served served({{"w", 16}}, RpcLimits{.max_streams = kCap});
  StatsResponse response;
  ASSERT_TRUE(AwaitWorkersDone(&served, 0, -1, absl::Seconds(30), &response).ok());
  const int64_t changes = response.worker_changes();
  std::vector<std::thread> chiefs;
  for (int i = 0; i < kCap; ++i) {
    chiefs.emplace_back([&] {
      StatsResponse answer;
      AwaitWorkersDone(&served, INT_MAX, changes, absl::Seconds(3), &answer);
    });
  }
  ASSERT_TRUE(Eventually([&] { return served.shard().waiting_done_calls() == kCap; }));
  const grpc::Status refused =
      AwaitWorkersDone(&served, INT_MAX, changes, absl::Seconds(3), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_streams"));
  for (std::thread& chief : chiefs) chief.join();
  ASSERT_TRUE(Eventually([&] { return served.shard().waiting_done_calls() == 0; }));
  EXPECT_TRUE(AwaitWorkersDone(&served, 0, -1, absl::Seconds(30), &response).ok());
}

// The server's threads are a fixed set, however many calls are open: a
// checkpoint asked for while one is being written (which holds the
// checkpoint thread in the process's hook) is refused at once with
// RESOURCE_EXHAUSTED, and the other calls are still answered meanwhile.
TEST(RpcLimitsTest, ACheckpointWhileOneIsWrittenIsRefusedAtOnceAndAddsNoThread) {
  constexpr int kCalls = 40;
  absl::Notification entered;
  absl::Notification release;
  AdminHooks hooks;
  hooks.checkpoint = [&entered, &release]() -> absl::StatusOr<CheckpointResponse> {
    if (!entered.HasBeenNotified()) entered.Notify();
    release.WaitForNotification();
    return CheckpointResponse();
  };
  Served served({{"w", 16}}, RpcLimits{.max_streams = 4}, ASYNC, 2, std::move(hooks));
  ASSERT_TRUE(served.Alive());
  grpc::CompletionQueue queue;
  struct Call {
    grpc::ClientContext context;
    CheckpointResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<CheckpointResponse>> reader;
  };
  auto start = [&](Call* call) {
    call->context.set_deadline(In(absl::Seconds(30)));
    call->reader = served.stub().AsyncCheckpoint(&call->context, CheckpointRequest(), &queue);
    call->reader->Finish(&call->response, &call->status, call);
  };
  Call first;
  start(&first);
  entered.WaitForNotification();
  const int64_t baseline = ProcStatus("Threads");
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::make_unique<Call>());
    start(calls.back().get());
  }
  for (int i = 0; i < kCalls; ++i) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(queue.Next(&tag, &ok));
    ASSERT_NE(tag, &first) << "the first checkpoint ended before it was let go";
    const grpc::Status& status = static_cast<Call*>(tag)->status;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
  }
  EXPECT_TRUE(served.Alive());  // other calls are answered meanwhile
  EXPECT_LE(ProcStatus("Threads"), baseline);
  release.Notify();
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(queue.Next(&tag, &ok));
  EXPECT_EQ(tag, &first);
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
}

}  // namespace
}  // namespace pst
