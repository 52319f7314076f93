// A hostile client against a real shard behind gRPC on 127.0.0.1: every
// RPC has a bounded cost (ps_server/service/rpc_limits.h). A request cannot make
// the answer many copies of the model; exchanges that are opened and never
// finished end at the idle deadline, within caps per worker and in total,
// and free what they held. Calls that wait: rpc_limits_waits_test.cc.
#include "ps_server/service/rpc_limits.h"

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
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/ps_server/service/rpc_limits_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace rpc_limits_testing;  // NOLINT(build/namespaces)

using ::testing::HasSubstr;

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
  // Named, not only admitted: a stream counts against its worker once its
  // header is read, and the third must come after both.
  ASSERT_TRUE(Eventually(
      [&] { return served.streams().open() == 2 && served.streams().unnamed() == 0; }));
  {
    AbandonedPush third_of_worker_0(&served.stub(), 0, kElements, absl::Seconds(20));
    grpc::Status status = third_of_worker_0.writer->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--max_streams_per_worker"));
  }
  open.push_back(std::make_unique<AbandonedPush>(&served.stub(), 1, kElements, absl::Seconds(20)));
  ASSERT_TRUE(Eventually(
      [&] { return served.streams().open() == 3 && served.streams().unnamed() == 0; }));
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

}  // namespace PST_FILE_ID
}  // namespace pst
