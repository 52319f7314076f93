// The bounds of calls that wait, against a real shard behind gRPC on
// 127.0.0.1: long-polls hold no thread while they wait, and those whose
// client has gone drop their waiter; waits end at their limits; unary
// calls past their caps are refused at once.
#include "ps_server/service/rpc_limits.h"

#include <chrono>
#include <atomic>
#include <climits>
#include <fstream>
#include <memory>
#include <optional>
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
#include "ps_server/service/done_waits.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "tests/ps_server/service/rpc_limits_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace rpc_limits_testing;  // NOLINT(build/namespaces)

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

// `as_worker`: the worker the call waits as; none for an observer.
grpc::Status AwaitWorkersDone(Served* served, int32_t timeout_ms, int64_t known_changes,
                              absl::Duration call_deadline, StatsResponse* response,
                              std::optional<int> as_worker = std::nullopt) {
  grpc::ClientContext context;
  context.set_deadline(In(call_deadline));
  AwaitWorkersDoneRequest request;
  request.set_timeout_ms(timeout_ms);
  request.set_known_changes(known_changes);
  if (as_worker) request.set_worker(*as_worker);
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

// Third hostile pass: a local process parked --max_streams AwaitWorkersDone
// calls and the chief's own wait was refused, which ended the job. Waits
// are per task now: observers fill only their pool, a worker holds two at
// most (a further one answers its oldest at once, OK), and the chief's
// wait always waits.
TEST(RpcLimitsTest, WaitsParkedByOthersNeverRefuseTheChiefsWait) {
  constexpr int kCap = 2;
  constexpr int kAsWorkerOne = 5;
  Served served({{"w", 16}}, RpcLimits{.max_streams = kCap});
  StatsResponse response;
  ASSERT_TRUE(AwaitWorkersDone(&served, 0, -1, absl::Seconds(30), &response).ok());
  const int64_t changes = response.worker_changes();
  std::vector<std::thread> parked;
  std::atomic<int> answered_ok{0};
  std::atomic<int> answered_other{0};
  auto park = [&](std::optional<int> as_worker) {
    parked.emplace_back([&, as_worker] {
      StatsResponse answer;
      grpc::Status status =
          AwaitWorkersDone(&served, INT_MAX, changes, absl::Seconds(20), &answer, as_worker);
      (status.ok() ? answered_ok : answered_other).fetch_add(1);
    });
  };
  for (int i = 0; i < kCap; ++i) park(std::nullopt);
  ASSERT_TRUE(Eventually([&] { return served.shard().waiting_done_calls() == kCap; }));
  // The observers' pool is full: one more observer is refused...
  grpc::Status refused = AwaitWorkersDone(&served, INT_MAX, changes, absl::Seconds(3), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  // ...and waits acting as worker 1 push out only worker 1's oldest, each
  // answered with the state at once.
  for (int i = 0; i < kAsWorkerOne; ++i) park(1);
  ASSERT_TRUE(Eventually([&] {
    return answered_ok.load() == kAsWorkerOne - DoneWaits::kPerWorker &&
           served.shard().waiting_done_calls() == kCap + DoneWaits::kPerWorker;
  })) << answered_ok.load() << " answered";
  EXPECT_EQ(answered_other.load(), 0);

  // The chief's wait waits, and is answered by the next change.
  grpc::Status chief;
  std::thread chief_waits([&] {
    StatsResponse answer;
    chief = AwaitWorkersDone(&served, INT_MAX, changes, absl::Seconds(20), &answer, 0);
  });
  ASSERT_TRUE(Eventually([&] {
    return served.shard().waiting_done_calls() == kCap + DoneWaits::kPerWorker + 1;
  })) << "the chief's wait was not let in";
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(10)));
  HeartbeatRequest heartbeat;
  heartbeat.set_worker(0);
  HeartbeatResponse heard;
  ASSERT_TRUE(served.stub().Heartbeat(&context, heartbeat, &heard).ok());
  chief_waits.join();
  EXPECT_TRUE(chief.ok()) << chief.error_code() << ": " << chief.error_message();
  for (std::thread& t : parked) t.join();
  EXPECT_EQ(answered_other.load(), 0);
  EXPECT_TRUE(Eventually([&] { return served.shard().waiting_done_calls() == 0; }));
}

// A wait that names a worker is checked as every call acting as one.
TEST(RpcLimitsTest, AWaitNamingNoWorkerOfTheJobIsRefused) {
  Served served({{"w", 16}}, RpcLimits{});
  StatsResponse response;
  for (int worker : {-1, 2, 1 << 30}) {
    SCOPED_TRACE(worker);
    grpc::Status status = AwaitWorkersDone(&served, 0, -1, absl::Seconds(10), &response, worker);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
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

}  // namespace PST_FILE_ID
}  // namespace pst
