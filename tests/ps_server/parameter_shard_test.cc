// The update semantics of one PS shard, without a network.
#include "ps_server/parameter_shard.h"
#include "ps_server/shard_calls.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/streamed_update.h"
#include "tests/support/eventually.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

OptimizerConfig PlainSgd(float lr) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(lr);
  return config;
}

ShardOptions Options(Mode mode, int workers, float lr = 1.0f) {
  ShardOptions options;
  options.mode = mode;
  options.num_workers = workers;
  options.optimizer = PlainSgd(lr);
  return options;
}

std::unique_ptr<ParameterShard> MakeShard(const ShardOptions& options) {
  auto shard = ParameterShard::Create(options);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(*shard);
}

std::unique_ptr<ParameterShard> MakeShard(Mode mode, int workers, float lr = 1.0f) {
  auto shard = ParameterShard::Create(Options(mode, workers, lr));
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(*shard);
}

void AddTensor(const std::string& name, std::vector<int64_t> shape, std::vector<float> values,
               google::protobuf::RepeatedPtrField<Tensor>* out) {
  EncodeTensor(name, shape, values, out->Add());
}

// Two variables: "w" [2, 2] = {1, 2, 3, 4} and "b" [2] = {0, 0}.
void InitTwoVariables(ParameterShard* shard) {
  InitRequest init;
  AddTensor("w", {2, 2}, {1, 2, 3, 4}, init.mutable_variables());
  AddTensor("b", {2}, {0, 0}, init.mutable_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  ASSERT_TRUE(response.accepted());
}

PushRequest Gradient(int worker, int64_t version, std::vector<float> w, std::vector<float> b) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  AddTensor("w", {2, 2}, std::move(w), push.mutable_gradients());
  AddTensor("b", {2}, std::move(b), push.mutable_gradients());
  return push;
}

std::vector<float> PullValues(ParameterShard* shard, const std::string& name,
                              int64_t* version = nullptr) {
  PullRequest pull;
  pull.add_names(name);
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now(), &response);
  EXPECT_TRUE(status.ok()) << status;
  if (version) *version = response.version();
  std::vector<float> values(response.variables(0).data().size() / sizeof(float));
  DecodeTensor(response.variables(0), values);
  return values;
}

StatsResponse StatsOf(ParameterShard* shard) {
  StatsResponse stats;
  shard->Stats(&stats);
  return stats;
}

TEST(ParameterShardTest, InitIsFirstWriterWins) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  InitRequest second;
  second.set_worker(1);
  AddTensor("w", {2, 2}, {9, 9, 9, 9}, second.mutable_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(second, &response).ok());
  EXPECT_FALSE(response.accepted());
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));
}

TEST(ParameterShardTest, SyncAppliesExactlyOnceWhenEveryWorkerHasPushed) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse first, second;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {2, 2}), &first).ok());
  EXPECT_EQ(first.outcome(), PushResponse::AGGREGATED);
  EXPECT_EQ(first.version(), 0);
  // Nothing applied yet: the step waits for worker 1.
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));

  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {3, 3, 3, 3}, {0, 4}), &second).ok());
  EXPECT_EQ(second.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(second.version(), 1);
  // lr 1, mean gradient w: 2, b: {1, 3}.
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(-1, 0, 1, 2));
  EXPECT_THAT(PullValues(shard.get(), "b"), ::testing::ElementsAre(-1, -3));
  StatsResponse stats = StatsOf(shard.get());
  EXPECT_EQ(stats.version(), 1);
  EXPECT_EQ(stats.pushes_applied(), 1);
  EXPECT_EQ(stats.pushes_aggregated(), 1);
}

TEST(ParameterShardTest, SyncDropsLateGradientsAndCountsThem) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  std::vector<float> before = PullValues(shard.get(), "w");

  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {100, 100, 100, 100}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::DROPPED);
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(PullValues(shard.get(), "w"), before);
  EXPECT_EQ(StatsOf(shard.get()).pushes_dropped(), 1);
}

TEST(ParameterShardTest, SyncResultIsBitwiseIndependentOfArrivalOrder) {
  constexpr int kWorkers = 4;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e3f);
  std::vector<std::vector<float>> grads(kWorkers, std::vector<float>(4));
  for (auto& g : grads) {
    for (float& x : g) x = normal(rng) * std::pow(10.0f, static_cast<float>(rng() % 6));
  }
  std::vector<int> order(kWorkers);
  std::iota(order.begin(), order.end(), 0);
  std::vector<float> reference;
  do {
    SCOPED_TRACE(::testing::PrintToString(order));
    auto shard = MakeShard(SYNC, kWorkers, 0.37f);
    InitTwoVariables(shard.get());
    PushResponse response;
    for (int worker : order) {
      ASSERT_TRUE(Push(*shard, Gradient(worker, 0, grads[worker], {0, 0}), &response).ok());
    }
    std::vector<float> values = PullValues(shard.get(), "w");
    if (reference.empty()) reference = values;
    ASSERT_EQ(0, std::memcmp(values.data(), reference.data(), values.size() * sizeof(float)));
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(ParameterShardTest, AsyncAppliesEveryGradientOnArrivalAndRecordsStaleness) {
  auto shard = MakeShard(ASYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(response.version(), 1);
  // Worker 1 computed at version 0 too: staleness 1.
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  EXPECT_EQ(response.version(), 2);
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(-1, 0, 1, 2));
  StatsResponse stats = StatsOf(shard.get());
  EXPECT_EQ(stats.pushes_applied(), 2);
  EXPECT_EQ(stats.workers(1).last_staleness(), 1);
  EXPECT_EQ(stats.workers(0).last_staleness(), 0);
}

// Four threads push gradients of exactly -1 with lr 1 in ASYNC mode: every
// element must end up exactly at its initial value plus the number of pushes
// (integers are exact in float32), so a lost or doubled update shows.
TEST(ParameterShardTest, AsyncConcurrentPushesAreEachAppliedExactlyOnce) {
  constexpr int kWorkers = 4;
  constexpr int kPushesPerWorker = 500;
  auto shard = MakeShard(ASYNC, kWorkers);
  InitTwoVariables(shard.get());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int worker = 0; worker < kWorkers; ++worker) {
    threads.emplace_back([&, worker] {
      for (int i = 0; i < kPushesPerWorker; ++i) {
        PullRequest pull;
        PullResponse pulled;
        if (!Pull(*shard, pull, absl::Now(), &pulled).ok()) ++failures;
        PushResponse response;
        if (!Push(*shard, Gradient(worker, pulled.version(), {-1, -1, -1, -1}, {-1, 0}), &response)
                 .ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures, 0);
  constexpr float kTotal = kWorkers * kPushesPerWorker;
  EXPECT_THAT(PullValues(shard.get(), "w"),
              ::testing::ElementsAre(1 + kTotal, 2 + kTotal, 3 + kTotal, 4 + kTotal));
  EXPECT_THAT(PullValues(shard.get(), "b"), ::testing::ElementsAre(kTotal, 0));
  StatsResponse stats = StatsOf(shard.get());
  EXPECT_EQ(stats.version(), kTotal);
  EXPECT_EQ(stats.pushes_applied(), kTotal);
  for (const WorkerStats& w : stats.workers()) EXPECT_EQ(w.pushes(), kPushesPerWorker);
}

TEST(ParameterShardTest, PullWaitsForTheRequestedVersion) {
  auto shard = MakeShard(SYNC, 1);
  InitTwoVariables(shard.get());
  // The push comes once the pull waits: one that came first would let a
  // pull that never waits pass.
  std::thread pusher([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_pulls() == 1; })) << "the pull never waited";
    PushResponse response;
    EXPECT_TRUE(Push(*shard, Gradient(0, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
  });
  PullRequest pull;
  pull.set_min_version(1);
  PullResponse response;
  EXPECT_TRUE(Pull(*shard, pull, absl::Now() + absl::Seconds(30), &response).ok());
  EXPECT_EQ(response.version(), 1);
  pusher.join();
  EXPECT_EQ(shard->waiting_pulls(), 0);
}

TEST(ParameterShardTest, PullTimesOutWithDeadlineExceeded) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PullRequest pull;
  pull.set_min_version(5);
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now() + absl::Milliseconds(20), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("version 5"));
}

TEST(ParameterShardTest, ShutdownWakesWaitingPulls) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  // Once the pull waits: a pull that starts after the shutdown fails at once
  // without being woken.
  std::thread stopper([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_pulls() == 1; })) << "the pull never waited";
    shard->BeginShutdown();
  });
  PullRequest pull;
  pull.set_min_version(1);
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now() + absl::Seconds(30), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  stopper.join();
}

// A pull that may not proceed leaves a waiter instead of parking a thread;
// the push that brings its version wakes it, once, and the pull then runs.
TEST(PullWaiterTest, IsWokenByTheVersionItWaitsForAndThenPulls) {
  auto shard = MakeShard(SYNC, 1);
  InitTwoVariables(shard.get());
  PullRequest pull;
  pull.set_min_version(1);
  int visits = 0;
  const ParameterShard::PullVisitor visit = [&](int64_t, const std::vector<const Variable*>&,
                                                const PulledRows&) { ++visits; };
  std::atomic<int> wakes{0};
  absl::StatusOr<ParameterShard::WaitId> waited =
      shard->PullVisitOrWait(pull, absl::Now() + absl::Seconds(60), visit, [&] { ++wakes; });
  ASSERT_TRUE(waited.ok()) << waited.status();
  ASSERT_NE(*waited, 0u);
  EXPECT_EQ(visits, 0);
  EXPECT_EQ(shard->waiting_pulls(), 1);
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
  EXPECT_EQ(wakes.load(), 1);
  EXPECT_EQ(shard->waiting_pulls(), 0);
  EXPECT_FALSE(shard->CancelWait(*waited)) << "a woken waiter is gone";
  waited = shard->PullVisitOrWait(pull, absl::Now() + absl::Seconds(60), visit, [&] { ++wakes; });
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, 0u);
  EXPECT_EQ(visits, 1);
  EXPECT_EQ(wakes.load(), 1);
}

// The shard's timer wakes a waiter at its deadline; the pull then ends with
// DeadlineExceeded, as a parked one does.
TEST(PullWaiterTest, IsWokenAtItsDeadline) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PullRequest pull;
  pull.set_min_version(5);
  absl::Notification woken;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  absl::StatusOr<ParameterShard::WaitId> waited = shard->PullVisitOrWait(
      pull, deadline, [](int64_t, const std::vector<const Variable*>&, const PulledRows&) {},
      [&] { woken.Notify(); });
  ASSERT_TRUE(waited.ok() && *waited != 0);
  woken.WaitForNotification();
  EXPECT_GE(absl::Now(), deadline);
  waited = shard->PullVisitOrWait(
      pull, deadline, [](int64_t, const std::vector<const Variable*>&, const PulledRows&) {},
      [] {});
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(waited.status().message(), HasSubstr("version 5"));
}

// A waiter whose caller went away is dropped: it never runs, and no longer
// counts or keeps its worker in flight.
TEST(PullWaiterTest, ACancelledWaiterIsNeverWoken) {
  auto shard = MakeShard(SYNC, 1);
  InitTwoVariables(shard.get());
  PullRequest pull;
  pull.set_min_version(1);
  bool woken = false;
  absl::StatusOr<ParameterShard::WaitId> waited = shard->PullVisitOrWait(
      pull, absl::Now() + absl::Seconds(60),
      [](int64_t, const std::vector<const Variable*>&, const PulledRows&) {},
      [&] { woken = true; });
  ASSERT_TRUE(waited.ok() && *waited != 0);
  EXPECT_TRUE(shard->CancelWait(*waited));
  EXPECT_EQ(shard->waiting_pulls(), 0);
  EXPECT_FALSE(shard->CancelWait(*waited));
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
  EXPECT_FALSE(woken);
}

TEST(PullWaiterTest, ShutdownWakesEveryWaiter) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PullRequest pull;
  pull.set_min_version(1);
  int woken = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(*shard->PullVisitOrWait(
                  pull, absl::Now() + absl::Seconds(60),
                  [](int64_t, const std::vector<const Variable*>&, const PulledRows&) {},
                  [&] { ++woken; }),
              0u);
  }
  shard->BeginShutdown();
  EXPECT_EQ(woken, 3);
  EXPECT_EQ(shard->waiting_pulls(), 0);
  EXPECT_EQ(shard
                ->PullVisitOrWait(
                    pull, absl::InfiniteFuture(),
                    [](int64_t, const std::vector<const Variable*>&, const PulledRows&) {}, [] {})
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

// AwaitWorkersDone without a thread: woken when a worker's standing changes.
TEST(AwaitWorkersDoneTest, AWaiterIsWokenWhenAWorkerIsDone) {
  auto shard = MakeShard(SYNC, 1);
  AwaitWorkersDoneRequest request;
  request.set_timeout_ms(60000);
  StatsResponse stats = StatsOf(shard.get());
  request.set_known_changes(stats.worker_changes());
  bool woken = false;
  absl::StatusOr<ParameterShard::WaitId> waited = shard->AwaitWorkersDoneOrWait(
      request, absl::Now() + absl::Seconds(60), &stats, [&] { woken = true; });
  ASSERT_TRUE(waited.ok() && *waited != 0);
  EXPECT_EQ(shard->waiting_done_calls(), 1);
  DoneRequest done;
  DoneResponse done_response;
  ASSERT_TRUE(shard->Done(done, &done_response).ok());
  EXPECT_TRUE(woken);
  EXPECT_EQ(shard->waiting_done_calls(), 0);
  StatsResponse answer;
  waited = shard->AwaitWorkersDoneOrWait(request, absl::Now() + absl::Seconds(60), &answer, [] {});
  ASSERT_TRUE(waited.ok());
  EXPECT_EQ(*waited, 0u);
  EXPECT_EQ(answer.workers_done(), 1);
}

// Every bad request is refused with the right code and leaves the model as
// it was.
TEST(ParameterShardTest, BadPushesAreRefusedAndLeaveTheModelUntouched) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string name;
    std::function<PushRequest()> make;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases = {
      {"unknown variable",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(1)->set_name("nope");
         return p;
       },
       absl::StatusCode::kInvalidArgument, "unknown variable \"nope\""},
      {"wrong payload size",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(0)->set_data(std::string(12, '\0'));
         return p;
       },
       absl::StatusCode::kInvalidArgument, "carries 12 bytes"},
      {"wrong shape",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(0)->clear_shape();
         p.mutable_gradients(0)->add_shape(4);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "wrong shape"},
      {"NaN gradient", [&] { return Gradient(0, 0, {1, nan, 1, 1}, {1, 1}); },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {"Inf gradient in the last variable", [&] { return Gradient(0, 0, {1, 1, 1, 1}, {1, inf}); },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      // 16-bit gradients are checked on their encoded bits.
      {"NaN bfloat16 gradient",
       [&] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         EncodeTensor("w", std::vector<int64_t>{2, 2}, std::vector<float>{1, 1, nan, 1},
                      p.mutable_gradients(0), BFLOAT16);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {"Inf float16 gradient (overflow past 65504)",
       [&] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{1, 1e6f},
                      p.mutable_gradients(1), FLOAT16);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {"future version", [] { return Gradient(0, 7, {1, 1, 1, 1}, {1, 1}); },
       absl::StatusCode::kInvalidArgument, "version 7"},
      {"worker out of range", [] { return Gradient(5, 0, {1, 1, 1, 1}, {1, 1}); },
       absl::StatusCode::kInvalidArgument, "worker index 5"},
      {"missing variable in SYNC",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients()->RemoveLast();
         return p;
       },
       absl::StatusCode::kInvalidArgument, "missing the gradient for \"b\""},
      {"same variable twice",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         *p.mutable_gradients(1) = p.gradients(0);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "appears twice"},
      {"unsupported dtype",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(0)->set_dtype(static_cast<DType>(7));
         return p;
       },
       absl::StatusCode::kInvalidArgument, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto shard = MakeShard(SYNC, 2);
    InitTwoVariables(shard.get());
    PushResponse response;
    absl::Status status = Push(*shard, c.make(), &response);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    // A good push from each worker must now complete the step normally: the
    // bad one neither applied nor counted as worker 0's gradient.
    ASSERT_TRUE(Push(*shard, Gradient(0, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
    ASSERT_TRUE(Push(*shard, Gradient(1, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
    EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));
    EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
  }
}

// A finite gradient can still overflow the optimizer (Adam squares it). The
// update is refused as a whole: no variable, no optimizer state, no version
// moves, in ASYNC; in SYNC the step completes (the workers wait for it) but
// leaves the model as it was. Then training goes on normally.
TEST(ParameterShardTest, AnUpdateThatWouldOverflowIsRefusedWhole) {
  constexpr float kHuge = 3e38f;  // finite; its square is not
  for (Mode mode : {ASYNC, SYNC}) {
    SCOPED_TRACE(ModeName(mode));
    ShardOptions options = Options(mode, mode == SYNC ? 2 : 1);
    options.optimizer.mutable_adam()->set_learning_rate(0.1f);
    auto shard = MakeShard(options);
    InitTwoVariables(shard.get());
    PushResponse response;
    // "w" alone would update fine; "b" overflows, so neither changes.
    absl::Status status = Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {kHuge, 0}), &response);
    if (mode == SYNC) {
      ASSERT_TRUE(status.ok()) << status;  // held for the step
      status = Push(*shard, Gradient(1, 0, {1, 1, 1, 1}, {kHuge, 0}), &response);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(response.version(), 1) << "the step completes so no worker waits forever";
      EXPECT_EQ(response.outcome(), PushResponse::SKIPPED)
          << "the worker that completed the step must learn that it changed nothing";
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(), HasSubstr("\"b\""));
    }
    EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));
    EXPECT_THAT(PullValues(shard.get(), "b"), ::testing::ElementsAre(0, 0));
    EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
    if (mode == ASYNC) {
      EXPECT_EQ(StatsOf(shard.get()).workers(0).clock(), 0) << "a refused push is not counted";
    }
    // The optimizer state was not touched either: a normal step afterwards
    // is Adam's first step (alpha * m / sqrt(v) = 0.1 * g / |g|).
    const int64_t version = mode == SYNC ? 1 : 0;
    ASSERT_TRUE(Push(*shard, Gradient(0, version, {1, 1, 1, 1}, {1, 1}), &response).ok());
    if (mode == SYNC) {
      ASSERT_TRUE(Push(*shard, Gradient(1, version, {1, 1, 1, 1}, {1, 1}), &response).ok());
    }
    EXPECT_THAT(PullValues(shard.get(), "b"),
                ::testing::ElementsAre(::testing::FloatNear(-0.1f, 1e-5f),
                                       ::testing::FloatNear(-0.1f, 1e-5f)));
  }
}

// A push with no gradient in it would otherwise count as an update and
// move the version (ASYNC), unary or streamed.
TEST(ParameterShardTest, AnEmptyPushIsRefusedAndLeavesTheVersion) {
  for (Mode mode : {ASYNC, SSP, SYNC}) {
    SCOPED_TRACE(ModeName(mode));
    auto shard = MakeShard(mode, 1);
    InitTwoVariables(shard.get());
    PushRequest empty;
    empty.set_worker(0);
    PushResponse response;
    absl::Status status = Push(*shard, empty, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("no gradients"));
    absl::StatusOr<ParameterShard::StreamedPush> streamed = shard->BeginStreamedPush(empty);
    EXPECT_EQ(streamed.status().code(), absl::StatusCode::kInvalidArgument) << streamed.status();
    EXPECT_EQ(shard->version(), 0);
    EXPECT_EQ(StatsOf(shard.get()).pushes_applied(), 0);
    EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 2);
  }
}

// A pull names each variable once: naming one many times would make a
// request of a few bytes per name cost a copy of the variable per name.
TEST(ParameterShardTest, APullNamingAVariableTwiceIsRefused) {
  auto shard = MakeShard(ASYNC, 1);
  InitTwoVariables(shard.get());
  PullRequest pull;
  // Moved in as std::string: GCC 12 takes add_names(const char*), inlined
  // here, for an overlapping copy of 2^63 bytes (-Wrestrict, a false alarm).
  for (const char* name : {"w", "b", "w"}) pull.add_names(std::string(name));
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now(), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("\"w\" twice"));
  EXPECT_EQ(response.variables_size(), 0);
}

// A bound on the answer is checked before anything is encoded.
TEST(ParameterShardTest, APullWhoseAnswerIsTooLargeIsRefusedBeforeItIsBuilt) {
  auto shard = MakeShard(ASYNC, 1);
  InitTwoVariables(shard.get());  // 6 floats: 24 bytes of payload, plus framing
  PullRequest pull;
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now(), &response, {.max_reply_bytes = 64});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("--max_reply_bytes"));
  EXPECT_EQ(response.variables_size(), 0);
  ASSERT_TRUE(Pull(*shard, pull, absl::Now(), &response, {.max_reply_bytes = 1 << 20}).ok());
  EXPECT_EQ(response.variables_size(), 2);
}

TEST(ParameterShardTest, PushBeforeInitIsAFailedPrecondition) {
  auto shard = MakeShard(ASYNC, 1);
  PushResponse response;
  absl::Status status = Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {1, 1}), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("before Init"));
}

TEST(ParameterShardTest, SecondPushForTheSameSyncStepIsRefused) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  absl::Status status = Push(*shard, Gradient(0, 0, {5, 5, 5, 5}, {0, 0}), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(0, 1, 2, 3));
}

TEST(ParameterShardTest, BadInitsAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::string name;
    std::function<void(InitRequest*)> fill;
    std::string message;
  };
  std::vector<Case> cases = {
      {"empty", [](InitRequest*) {}, "no variables"},
      {"duplicate name",
       [](InitRequest* r) {
         AddTensor("w", {1}, {1}, r->mutable_variables());
         AddTensor("w", {1}, {1}, r->mutable_variables());
       },
       "twice"},
      {"zero dimension", [](InitRequest* r) { AddTensor("w", {0}, {}, r->mutable_variables()); },
       "non-positive dimension"},
      {"size mismatch", [](InitRequest* r) { AddTensor("w", {3}, {1, 2}, r->mutable_variables()); },
       "carries 8 bytes"},
      {"NaN value", [&](InitRequest* r) { AddTensor("w", {2}, {1, nan}, r->mutable_variables()); },
       "non-finite"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto shard = MakeShard(SYNC, 1);
    InitRequest request;
    c.fill(&request);
    InitResponse response;
    absl::Status status = shard->Init(request, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    // Still uninitialized: a good Init is accepted afterwards.
    InitTwoVariables(shard.get());
  }
}

// Backup workers: with replicas_to_aggregate = 2 of 3, a step completes with
// the first two gradients, and the third, now late, is dropped and counted.
TEST(ParameterShardTest, SyncWithBackupWorkersCompletesWithTheFirstReplicas) {
  ShardOptions options = Options(SYNC, 3);
  options.replicas_to_aggregate = 2;
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(2, 0, {2, 2, 2, 2}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::AGGREGATED);
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {4, 4, 4, 4}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(-2, -1, 0, 1));  // mean 3
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {100, 100, 100, 100}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::DROPPED);
  StatsResponse stats = StatsOf(shard.get());
  EXPECT_EQ(stats.pushes_dropped(), 1);
  EXPECT_EQ(stats.workers(1).dropped(), 1);
  EXPECT_EQ(stats.version(), 1);
}

// A worker that pushed its last gradient and said Done still counts for that
// step: the step must not complete without the other workers.
TEST(ParameterShardTest, DoneAfterPushingDoesNotCompleteTheStepEarly) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {2, 2, 2, 2}, {0, 0}), &response).ok());
  DoneResponse done;
  DoneRequest done_request;
  ASSERT_TRUE(shard->Done(done_request, &done).ok());
  EXPECT_EQ(StatsOf(shard.get()).version(), 0);
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(0, 1, 2, 3));
}

// A SYNC step no longer waits for a worker whose lease ran out.
TEST(ParameterShardTest, SyncStepCompletesWithoutAWorkerWhoseLeaseExpired) {
  ShardOptions options = Options(SYNC, 2);
  options.lease = absl::Milliseconds(200);
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  HeartbeatRequest beat;
  beat.set_worker(1);
  HeartbeatResponse beat_response;
  ASSERT_TRUE(shard->Heartbeat(beat, &beat_response).ok());  // worker 1 seen, then silent
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {2, 2, 2, 2}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::AGGREGATED);
  PullRequest pull;
  pull.set_min_version(1);
  PullResponse pulled;
  absl::Time start = absl::Now();
  ASSERT_TRUE(Pull(*shard, pull, absl::Now() + absl::Seconds(10), &pulled).ok());
  EXPECT_EQ(pulled.version(), 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  StatsResponse stats = StatsOf(shard.get());
  EXPECT_FALSE(stats.workers(1).live());
  EXPECT_EQ(stats.live_workers(), 1);
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(-1, 0, 1, 2));
  // The worker comes back: it is live again and takes part in the next step.
  ASSERT_TRUE(shard->Heartbeat(beat, &beat_response).ok());
  ASSERT_TRUE(Push(*shard, Gradient(0, 1, {0, 0, 0, 0}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::AGGREGATED);
  ASSERT_TRUE(Push(*shard, Gradient(1, 1, {0, 0, 0, 0}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
}

// SSP(K): a worker K+1 pushes ahead of the slowest waits at Pull until the
// slowest catches up; every pull that returns respects the bound.
TEST(ParameterShardTest, SspHoldsAWorkerThatRunsTooFarAhead) {
  ShardOptions options = Options(SSP, 2);
  options.staleness = 2;
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  PushResponse response;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Push(*shard, Gradient(0, StatsOf(shard.get()).version(), {0, 0, 0, 0}, {0, 0}), &response).ok());
  }
  PullRequest pull;
  pull.set_worker(0);
  PullResponse pulled;
  absl::Status status = Pull(*shard, pull, absl::Now() + absl::Milliseconds(100), &pulled);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);  // clock 3, slowest 0
  std::thread slow([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_pulls() == 1; })) << "the pull never waited";
    PushResponse r;
    EXPECT_TRUE(Push(*shard, Gradient(1, 0, {0, 0, 0, 0}, {0, 0}), &r).ok());
  });
  EXPECT_TRUE(Pull(*shard, pull, absl::Now() + absl::Seconds(30), &pulled).ok());
  slow.join();
  StatsResponse stats = StatsOf(shard.get());
  EXPECT_LE(stats.workers(0).clock() - stats.workers(1).clock(), 2);
  EXPECT_EQ(stats.clock_spread(), 2);
}

// A finished worker does not hold back SSP's slowest clock.
TEST(ParameterShardTest, SspIgnoresFinishedWorkers) {
  ShardOptions options = Options(SSP, 2);
  options.staleness = 0;
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
  DoneRequest done;
  done.set_worker(1);
  DoneResponse done_response;
  ASSERT_TRUE(shard->Done(done, &done_response).ok());
  PullRequest pull;
  PullResponse pulled;
  EXPECT_TRUE(Pull(*shard, pull, absl::Now() + absl::Seconds(5), &pulled).ok());
}

TEST(ParameterShardTest, AsyncDropsGradientsPastMaxStalenessAndScalesTheRest) {
  ShardOptions options = Options(ASYNC, 2);
  options.max_staleness = 1;
  options.staleness_lr_scaling = true;
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());  // staleness 0
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {2, 2, 2, 2}, {0, 0}), &response).ok());  // staleness 1: lr / 2
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {9, 9, 9, 9}, {0, 0}), &response).ok());  // staleness 2
  EXPECT_EQ(response.outcome(), PushResponse::DROPPED);
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(-1, 0, 1, 2));
  EXPECT_EQ(StatsOf(shard.get()).pushes_dropped(), 1);
}

// --- Liveness on the lease tracker's timer; AwaitWorkersDone ---

void Heartbeat(ParameterShard* shard, int worker) {
  HeartbeatRequest request;
  request.set_worker(worker);
  HeartbeatResponse response;
  ASSERT_TRUE(shard->Heartbeat(request, &response).ok());
}

void Done(ParameterShard* shard, int worker) {
  DoneRequest request;
  request.set_worker(worker);
  DoneResponse response;
  ASSERT_TRUE(shard->Done(request, &response).ok());
}

// A SYNC shard of two workers on `clock`, initialized, where worker 1 has
// been heard from once and worker 0 has pushed: the step waits for worker 1.
std::unique_ptr<ParameterShard> SyncStepWaitingForWorker1(const LeaseClock* clock) {
  ShardOptions options = Options(SYNC, 2);
  options.lease = absl::Seconds(5);
  options.lease_clock = clock;
  auto shard = MakeShard(options);
  InitTwoVariables(shard.get());
  Heartbeat(shard.get(), 1);
  PushResponse response;
  EXPECT_TRUE(Push(*shard, Gradient(0, 0, {2, 2, 2, 2}, {0, 0}), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::AGGREGATED);
  return shard;
}

// Nobody calls in once the step waits: the step completes because the
// tracker let worker 1's lease run out, on its own.
TEST(LivenessTest, ALeaseRunningOutCompletesASyncStepWithNoCaller) {
  ManualLeaseClock clock;
  auto shard = SyncStepWaitingForWorker1(&clock);
  clock.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] { return clock.sleepers() == 1; }));
  EXPECT_EQ(shard->version(), 0) << "the lease had not run out yet";
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] { return shard->version() == 1; })) << "the step never completed";
  EXPECT_FALSE(StatsOf(shard.get()).workers(1).live());
  // The mean of worker 0's gradient alone.
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(-1, 0, 1, 2));
}

TEST(LivenessTest, AWaitingPullIsWokenByALeaseRunningOut) {
  ManualLeaseClock clock;
  auto shard = SyncStepWaitingForWorker1(&clock);
  std::thread expirer([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_pulls() == 1; })) << "the pull never waited";
    clock.Advance(absl::Seconds(5));
  });
  PullRequest pull;
  pull.set_min_version(1);
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now() + absl::Seconds(60), &response);
  expirer.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(response.version(), 1);
}

// Time the test sets, and a tracker held asleep until the test lets it go:
// a lease can run out by the clock with the tracker yet to act on it (as
// between the two in a running shard).
class HeldClock final : public LeaseClock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void WaitUntil(absl::Mutex* mu, absl::CondVar* cv, absl::Time) const override {
    do {
      cv->Wait(mu);
    } while (held_.load());
  }
  void Advance(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    now_ += by;
  }
  // Lets the tracker wake at its next signal (its shard's destruction).
  void Release() { held_ = false; }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::UnixEpoch();
  std::atomic<bool> held_{true};
};

// Stats is a read: however often it is called, a lease that has run out
// (which Stats reports) completes no step and leaves the live set alone.
TEST(LivenessTest, StatsChangesNothing) {
  HeldClock clock;
  auto shard = SyncStepWaitingForWorker1(&clock);
  absl::Cleanup release = [&] { clock.Release(); };  // before the shard goes
  clock.Advance(absl::Minutes(1));
  for (int i = 0; i < 5; ++i) {
    StatsResponse stats = StatsOf(shard.get());
    EXPECT_EQ(stats.version(), 0);
    EXPECT_EQ(stats.pushes_aggregated(), 1);
    EXPECT_TRUE(stats.workers(1).live());
    EXPECT_GE(stats.workers(1).seconds_since_seen(), 60.0);
  }
  EXPECT_EQ(shard->version(), 0);
}

TEST(AwaitWorkersDoneTest, ReturnsWhenTheLastWorkerIsDone) {
  auto shard = MakeShard(ASYNC, 2);
  Done(shard.get(), 0);
  AwaitWorkersDoneRequest request;
  request.set_known_changes(StatsOf(shard.get()).worker_changes());
  std::thread finisher([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_done_calls() == 1; })) << "never waited";
    Done(shard.get(), 1);
  });
  StatsResponse stats;
  absl::Status status = AwaitWorkersDone(*shard, request, absl::Now() + absl::Seconds(60), &stats);
  finisher.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(stats.workers_done(), 2);
  EXPECT_EQ(shard->waiting_done_calls(), 0);
}

TEST(AwaitWorkersDoneTest, TimesOutCleanlyWithTheStateThen) {
  auto shard = MakeShard(ASYNC, 2);
  Done(shard.get(), 0);
  const int64_t changes = StatsOf(shard.get()).worker_changes();
  AwaitWorkersDoneRequest request;
  request.set_known_changes(changes);
  StatsResponse stats;
  absl::Status status =
      AwaitWorkersDone(*shard, request, absl::Now() + absl::Milliseconds(50), &stats);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(stats.workers_done(), 1);
  EXPECT_EQ(stats.worker_changes(), changes);
  EXPECT_EQ(shard->waiting_done_calls(), 0);
}

// Whatever the caller has not seen is answered at once: with -1 (nothing
// seen), or with a count that is out of date.
TEST(AwaitWorkersDoneTest, AnswersAtOnceWhatTheCallerHasNotSeen) {
  auto shard = MakeShard(ASYNC, 2);
  Heartbeat(shard.get(), 0);  // first heard from: a change
  const int64_t changes = StatsOf(shard.get()).worker_changes();
  EXPECT_EQ(changes, 1);
  for (int64_t known : {int64_t{-1}, changes - 1, changes + 5}) {
    SCOPED_TRACE(known);
    AwaitWorkersDoneRequest request;
    request.set_known_changes(known);
    request.set_timeout_ms(600000);
    StatsResponse stats;
    const absl::Time start = absl::Now();
    ASSERT_TRUE(AwaitWorkersDone(*shard, request, start + absl::Minutes(2), &stats).ok());
    EXPECT_LT(absl::Now() - start, absl::Minutes(1)) << "it waited";
    EXPECT_EQ(stats.worker_changes(), changes);
    EXPECT_GE(stats.workers(0).seconds_since_seen(), 0.0);
  }
}

// The chief hears of a worker leaving the live set as it happens.
TEST(AwaitWorkersDoneTest, IsWokenWhenAWorkerLeavesTheLiveSet) {
  ManualLeaseClock clock;
  ShardOptions options = Options(ASYNC, 2);
  options.lease = absl::Seconds(5);
  options.lease_clock = &clock;
  auto shard = MakeShard(options);
  Heartbeat(shard.get(), 1);
  AwaitWorkersDoneRequest request;
  request.set_known_changes(StatsOf(shard.get()).worker_changes());
  std::thread expirer([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_done_calls() == 1; })) << "never waited";
    clock.Advance(absl::Seconds(5));
  });
  StatsResponse stats;
  absl::Status status = AwaitWorkersDone(*shard, request, absl::Now() + absl::Seconds(60), &stats);
  expirer.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_FALSE(stats.workers(1).live());
  EXPECT_EQ(stats.worker_changes(), request.known_changes() + 1);
}

TEST(AwaitWorkersDoneTest, RefusesBadRequests) {
  struct Case {
    const char* name;
    int32_t timeout_ms;
    int64_t known_changes;
    const char* message;
  };
  for (const Case& c : {Case{"negative timeout", -1, 0, "timeout_ms"},
                        Case{"known_changes below -1", 10, -2, "known_changes"}}) {
    SCOPED_TRACE(c.name);
    auto shard = MakeShard(ASYNC, 1);
    AwaitWorkersDoneRequest request;
    request.set_timeout_ms(c.timeout_ms);
    request.set_known_changes(c.known_changes);
    StatsResponse stats;
    absl::Status status = AwaitWorkersDone(*shard, request, absl::Now() + absl::Seconds(5), &stats);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(AwaitWorkersDoneTest, EndsWhenItsWaiterIsCancelledOrTheShardShutsDown) {
  auto shard = MakeShard(ASYNC, 2);
  AwaitWorkersDoneRequest request;
  StatsResponse stats;
  bool woken = false;
  absl::StatusOr<ParameterShard::WaitId> waited = shard->AwaitWorkersDoneOrWait(
      request, absl::Now() + absl::Minutes(5), &stats, [&] { woken = true; });
  ASSERT_TRUE(waited.ok() && *waited != 0);
  EXPECT_TRUE(shard->CancelWait(*waited));  // its caller went away
  EXPECT_EQ(shard->waiting_done_calls(), 0);
  EXPECT_FALSE(woken);

  absl::Status status;
  std::thread stopper([&] {
    EXPECT_TRUE(Eventually([&] { return shard->waiting_done_calls() == 1; })) << "never waited";
    shard->BeginShutdown();
  });
  status = AwaitWorkersDone(*shard, request, absl::Now() + absl::Minutes(5), &stats);
  stopper.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

// --- Updates applied while their gradient streams in (StreamedUpdate) ---

// Two variables of sizes that are no multiple of any block: "big" [3, 4099]
// and "small" [5], filled with 0.001 * i.
InitRequest StreamingModel() {
  InitRequest init;
  std::vector<float> big(3 * 4099), small(5);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.001f * static_cast<float>(i % 1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = 0.5f * static_cast<float>(i);
  AddTensor("big", {3, 4099}, big, init.mutable_variables());
  AddTensor("small", {5}, small, init.mutable_variables());
  return init;
}

std::vector<std::vector<float>> StreamingGradients(int round) {
  std::vector<std::vector<float>> g = {std::vector<float>(3 * 4099), std::vector<float>(5)};
  for (auto& tensor : g) {
    for (size_t i = 0; i < tensor.size(); ++i) {
      tensor[i] = std::sin(0.37f * static_cast<float>(i + 11 * round));
    }
  }
  return g;
}

PushRequest StreamingPush(int worker, int64_t version, const std::vector<std::vector<float>>& g) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  AddTensor("big", {3, 4099}, g[0], push.mutable_gradients());
  AddTensor("small", {5}, g[1], push.mutable_gradients());
  return push;
}

// A push's header as a stream announces it: names, shapes, dtypes, no data.
PushRequest HeaderOf(PushRequest push) {
  for (Tensor& t : *push.mutable_gradients()) t.clear_data();
  return push;
}

// Applies `g` to `update` in uneven pieces, as a stream would deliver them.
void ApplyInPieces(StreamedUpdate* update, const std::vector<std::vector<float>>& g) {
  for (size_t t = 0; t < g.size(); ++t) {
    const std::span<const float> all(g[t]);
    size_t first = 0;
    for (size_t piece : {size_t{1}, size_t{4095}, size_t{3000}, size_t{2049}}) {
      piece = std::min(piece, all.size() - first);
      update->Apply(static_cast<int>(t), static_cast<int64_t>(first), all.subspan(first, piece));
      first += piece;
    }
    update->Apply(static_cast<int>(t), static_cast<int64_t>(first), all.subspan(first));
  }
}

TEST(StreamedUpdateTest, PieceByPieceEqualsOnePushBitForBit) {
  // Adam: state slots and bias correction must come out the same too,
  // hence two rounds.
  ShardOptions options = Options(ASYNC, 1);
  options.optimizer.mutable_adam()->set_learning_rate(0.01f);
  auto whole = MakeShard(options);
  auto streamed = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(whole->Init(StreamingModel(), &init).ok());
  ASSERT_TRUE(streamed->Init(StreamingModel(), &init).ok());
  for (int round = 0; round < 2; ++round) {
    const std::vector<std::vector<float>> g = StreamingGradients(round);
    PushResponse expected, response;
    ASSERT_TRUE(Push(*whole, StreamingPush(0, round, g), &expected).ok());
    auto push = streamed->BeginStreamedPush(HeaderOf(StreamingPush(0, round, g)));
    ASSERT_TRUE(push.ok()) << push.status();
    EXPECT_THAT(push->bytes, ::testing::ElementsAre(3 * 4099 * 4, 5 * 4));
    ASSERT_NE(push->update, nullptr) << "an idle ASYNC shard applies a stream as it comes";
    ApplyInPieces(push->update.get(), g);
    ASSERT_TRUE(streamed->CommitStreamedPush(std::move(push->update), &response).ok());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
    EXPECT_EQ(response.version(), expected.version());
  }
  for (const char* name : {"big", "small"}) {
    const std::vector<float> a = PullValues(whole.get(), name);
    const std::vector<float> b = PullValues(streamed.get(), name);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name;
  }
  EXPECT_EQ(StatsOf(streamed.get()).pushes_applied(), 2);
  EXPECT_EQ(StatsOf(streamed.get()).workers(0).clock(), 2);
}

// A gradient at hand whole (a shared region's) is staged in parts at once
// on the shard's threads, each on its own copy of the target.
TEST(StreamedUpdateTest, AWholeGradientStagedInPartsEqualsOnePushBitForBit) {
  constexpr int64_t kRows = 5, kColumns = 40001;  // above the parallel threshold
  constexpr int64_t kBlock = 4096;
  ShardOptions options = Options(ASYNC, 1);
  options.optimizer.mutable_adam()->set_learning_rate(0.01f);
  auto whole = MakeShard(options);
  auto parts = MakeShard(options);
  InitRequest init;
  std::vector<float> initial(kRows * kColumns);
  for (size_t i = 0; i < initial.size(); ++i) initial[i] = 0.001f * static_cast<float>(i % 997);
  AddTensor("big", {kRows, kColumns}, initial, init.mutable_variables());
  InitResponse init_response;
  ASSERT_TRUE(whole->Init(init, &init_response).ok());
  ASSERT_TRUE(parts->Init(init, &init_response).ok());
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  for (int round = 0; round < 2; ++round) {  // Adam's state must match too
    std::vector<float> g(kRows * kColumns);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * static_cast<float>(i + round));
    PushRequest push;
    push.set_worker(0);
    push.set_computed_at_version(round);
    AddTensor("big", {kRows, kColumns}, g, push.mutable_gradients());
    PushResponse expected, response;
    ASSERT_TRUE(Push(*whole, push, &expected).ok());
    auto begun = parts->BeginStreamedPush(HeaderOf(push));
    ASSERT_TRUE(begun.ok() && begun->update != nullptr);
    std::vector<int64_t> staged;  // first element of each block
    ASSERT_TRUE(begun->update
                    ->ApplyWhole(0, kRows * kColumns, kBlock,
                                 [&](VariableStore::StageTarget* target, int64_t first,
                                     int64_t count) {
                                   {
                                     absl::MutexLock lock(&mu);
                                     threads.insert(std::this_thread::get_id());
                                     staged.push_back(first);
                                   }
                                   EXPECT_LE(count, kBlock);
                                   target->Apply(first, std::span<const float>(g).subspan(
                                                            first, count));
                                   return absl::OkStatus();
                                 })
                    .ok());
    std::sort(staged.begin(), staged.end());
    ASSERT_EQ(staged.size(), static_cast<size_t>((kRows * kColumns + kBlock - 1) / kBlock));
    for (size_t b = 0; b < staged.size(); ++b) EXPECT_EQ(staged[b], b * kBlock);
    ASSERT_TRUE(parts->CommitStreamedPush(std::move(begun->update), &response).ok());
    EXPECT_EQ(response.version(), expected.version());
  }
  const std::vector<float> a = PullValues(whole.get(), "big");
  const std::vector<float> b = PullValues(parts.get(), "big");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  if (std::thread::hardware_concurrency() > 1) {
    EXPECT_GT(threads.size(), 1u);
  }
}

TEST(StreamedUpdateTest, APartThatFailsFailsTheWholeAndNothingLands) {
  constexpr int64_t kElements = 200000;
  auto shard = MakeShard(ASYNC, 1);
  InitRequest init;
  AddTensor("big", {kElements}, std::vector<float>(kElements, 1.0f), init.mutable_variables());
  InitResponse init_response;
  ASSERT_TRUE(shard->Init(init, &init_response).ok());
  PushRequest header;
  header.set_worker(0);
  Tensor* gradient = header.add_gradients();
  gradient->set_name("big");
  gradient->add_shape(kElements);
  gradient->set_dtype(FLOAT32);
  const std::vector<float> g(kElements, 0.5f);
  {
    auto begun = shard->BeginStreamedPush(header);
    ASSERT_TRUE(begun.ok() && begun->update != nullptr);
    absl::Status status = begun->update->ApplyWhole(
        0, kElements, 1024, [&](VariableStore::StageTarget* target, int64_t first, int64_t count) {
          if (first == 150 * 1024) return absl::InvalidArgumentError("block 150 is bad");
          target->Apply(first, std::span<const float>(g).subspan(first, count));
          return absl::OkStatus();
        });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), ::testing::HasSubstr("block 150"));
  }  // dropped
  EXPECT_THAT(PullValues(shard.get(), "big"), ::testing::Each(1.0f));
  EXPECT_EQ(StatsOf(shard.get()).pushes_applied(), 0);
}

// A push that can wait where it lies (a shared region) is told it only
// awaits its turn; its waiter for the turn is woken when the update
// staging before it is committed, and it then gets an update of its own.
TEST(StreamedUpdateTest, APushThatMayWaitIsStagedAfterTheUpdateBeforeIt) {
  auto shard = MakeShard(ASYNC, 2);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto first = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(first.ok() && first->update != nullptr);
  auto busy = shard->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(busy->update, nullptr);
  EXPECT_TRUE(busy->awaits_turn);

  absl::Notification turn;
  ASSERT_NE(shard->AwaitUpdateTurnOrWait([&turn] { turn.Notify(); }), 0u);
  EXPECT_EQ(shard->waiting_updates(), 1);
  ApplyInPieces(first->update.get(), g);
  EXPECT_FALSE(turn.HasBeenNotified()) << "woken while another update was staging";
  PushResponse response;
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(first->update), &response).ok());
  EXPECT_TRUE(turn.HasBeenNotified()) << "the commit did not wake the waiter for the turn";
  EXPECT_EQ(shard->waiting_updates(), 0);
  auto second = shard->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_NE(second->update, nullptr);
  ApplyInPieces(second->update.get(), g);
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(second->update), &response).ok());
  EXPECT_EQ(response.version(), 2);

  // SYNC never streams: nothing to wait for.
  auto sync = MakeShard(SYNC, 2);
  ASSERT_TRUE(sync->Init(StreamingModel(), &init).ok());
  auto summed = sync->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(summed.ok());
  EXPECT_EQ(summed->update, nullptr);
  EXPECT_FALSE(summed->awaits_turn);
}

TEST(StreamedUpdateTest, OtherUpdatesWaitAndPullsSeeTheOldValuesUntilItCommits) {
  auto shard = MakeShard(ASYNC, 2);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> before = PullValues(shard.get(), "small");
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto first = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(first.ok() && first->update != nullptr);
  EXPECT_TRUE(shard->streamed_update_staged());
  // A second stream meanwhile is reassembled instead, and pushed whole.
  auto second = shard->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->update, nullptr);
  ApplyInPieces(first->update.get(), g);
  EXPECT_EQ(PullValues(shard.get(), "small"), before) << "staged, not yet visible";

  std::atomic<bool> pushed{false};
  PushResponse later;
  std::thread pusher([&] {
    EXPECT_TRUE(Push(*shard, StreamingPush(1, 0, g), &later).ok());
    pushed = true;
  });
  EXPECT_TRUE(Eventually([&] { return shard->waiting_updates() == 1 || pushed.load(); }));
  EXPECT_FALSE(pushed.load()) << "a push went through while a streamed update was staged";
  EXPECT_EQ(shard->waiting_updates(), 1);
  PushResponse response;
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(first->update), &response).ok());
  pusher.join();
  EXPECT_EQ(shard->waiting_updates(), 0);
  EXPECT_FALSE(shard->streamed_update_staged());
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(later.version(), 2) << "applied after the streamed update, on top of it";
  const std::vector<float> after = PullValues(shard.get(), "small");
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_FLOAT_EQ(after[i], before[i] - 2 * g[1][i]) << i;
  }
}

TEST(StreamedUpdateTest, AnAbandonedUpdateLeavesNoTraceAndFreesTheStaging) {
  auto shard = MakeShard(ASYNC, 1);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> before = PullValues(shard.get(), "big");
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  {
    auto push = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
    ASSERT_TRUE(push.ok() && push->update != nullptr);
    push->update->Apply(0, 0, std::span<const float>(g[0]).first(5000));
  }  // the stream broke off
  EXPECT_EQ(PullValues(shard.get(), "big"), before);
  EXPECT_EQ(StatsOf(shard.get()).version(), 0);
  EXPECT_EQ(StatsOf(shard.get()).workers(0).clock(), 0);
  PushResponse response;
  ASSERT_TRUE(Push(*shard, StreamingPush(0, 0, g), &response).ok()) << "the staging is free";
  EXPECT_EQ(response.version(), 1);
}

TEST(StreamedUpdateTest, AnUpdateThatWouldOverflowIsRefusedWholeAtCommit) {
  ShardOptions options = Options(ASYNC, 1);
  options.optimizer.mutable_adam()->set_learning_rate(0.1f);
  auto shard = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> big = PullValues(shard.get(), "big");
  std::vector<std::vector<float>> g = StreamingGradients(0);
  g[1][3] = 3e38f;  // finite; Adam's squared gradient is not
  auto push = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(push.ok() && push->update != nullptr);
  ApplyInPieces(push->update.get(), g);
  PushResponse response;
  absl::Status status = shard->CommitStreamedPush(std::move(push->update), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"small\""));
  EXPECT_EQ(PullValues(shard.get(), "big"), big) << "the variable that updated fine kept its values too";
  EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
  EXPECT_EQ(StatsOf(shard.get()).version(), 0);
  ASSERT_TRUE(Push(*shard, StreamingPush(0, 0, StreamingGradients(1)), &response).ok());
}

TEST(StreamedUpdateTest, OnlyAnAsyncPushThatWillBeAppliedStreamsItsUpdate) {
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  InitResponse init;
  auto sync = MakeShard(SYNC, 2);
  ASSERT_TRUE(sync->Init(StreamingModel(), &init).ok());
  auto push = sync->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->update, nullptr) << "SYNC averages first";
  EXPECT_THAT(push->bytes, ::testing::ElementsAre(3 * 4099 * 4, 5 * 4));

  ShardOptions options = Options(ASYNC, 2);
  options.max_staleness = 1;
  auto bounded = MakeShard(options);
  ASSERT_TRUE(bounded->Init(StreamingModel(), &init).ok());
  PushResponse response;
  ASSERT_TRUE(Push(*bounded, StreamingPush(0, 0, g), &response).ok());
  ASSERT_TRUE(Push(*bounded, StreamingPush(0, 1, g), &response).ok());
  push = bounded->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));  // staleness 2
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->update, nullptr) << "a gradient to be dropped is not applied";

  // A header the shard refuses is refused before any payload, and counted.
  PushRequest bad = HeaderOf(StreamingPush(0, 2, g));
  bad.mutable_gradients(1)->mutable_shape()->Set(0, 6);
  push = bounded->BeginStreamedPush(bad);
  EXPECT_EQ(push.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(push.status().message(), HasSubstr("wrong shape"));
  bad = HeaderOf(StreamingPush(0, 7, g));
  EXPECT_EQ(bounded->BeginStreamedPush(bad).status().code(), absl::StatusCode::kInvalidArgument)
      << "a gradient from the future";
  EXPECT_EQ(StatsOf(bounded.get()).pushes_rejected(), 2);
}


TEST(StreamedUpdateTest, AStalledStreamIsCancelledWhenAnotherUpdateWaits) {
  ShardOptions options = Options(ASYNC, 2);
  options.stalled_stream_timeout = absl::Milliseconds(300);
  auto shard = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> before = PullValues(shard.get(), "small");
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto stalled = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(stalled.ok() && stalled->update != nullptr);
  std::atomic<int> cancels{0};
  absl::Notification cancelled;
  stalled->update->SetCancel([&] {
    if (++cancels == 1) cancelled.Notify();
  });
  stalled->update->Apply(0, 0, std::span<const float>(g[0]).first(100));  // then nothing

  const absl::Time start = absl::Now();
  PushResponse pushed;
  std::thread pusher([&] { EXPECT_TRUE(Push(*shard, StreamingPush(1, 0, g), &pushed).ok()); });
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(cancels.load(), 1);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250)) << "cancelled before it stalled";
  // The stream's reads now fail: whatever it does next, nothing of it lands.
  ApplyInPieces(stalled->update.get(), g);
  PushResponse response;
  absl::Status status = shard->CommitStreamedPush(std::move(stalled->update), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  pusher.join();
  EXPECT_EQ(pushed.version(), 1);
  const std::vector<float> after = PullValues(shard.get(), "small");
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - g[1][i]) << i;
  EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
  EXPECT_EQ(cancels.load(), 1);
}

TEST(StreamedUpdateTest, AStreamThatKeepsDeliveringIsNotCancelled) {
  ShardOptions options = Options(ASYNC, 2);
  options.stalled_stream_timeout = absl::Milliseconds(600);
  auto shard = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto slow = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(slow.ok() && slow->update != nullptr);
  std::atomic<int> cancels{0};
  slow->update->SetCancel([&] { ++cancels; });
  PushResponse pushed;
  std::atomic<bool> push_returned{false};
  std::thread pusher([&] {
    EXPECT_TRUE(Push(*shard, StreamingPush(1, 0, g), &pushed).ok());
    push_returned = true;
  });
  // The stall timeout only runs while another update waits: the stream
  // starts delivering once the push waits, and keeps up its progress until
  // then as a live stream would.
  EXPECT_TRUE(Eventually([&] {
    slow->update->Progressed();
    return shard->waiting_updates() == 1;
  })) << "the push never waited";
  // Three times the timeout in all, never more than a third of it silent:
  // the pauses are the slow stream under test.
  const std::span<const float> big(g[0]);
  const size_t step = big.size() / 18 + 1;
  for (size_t first = 0; first < big.size(); first += step) {
    absl::SleepFor(absl::Milliseconds(100));
    slow->update->Progressed();
    slow->update->Apply(0, static_cast<int64_t>(first),
                        big.subspan(first, std::min(step, big.size() - first)));
  }
  slow->update->Apply(1, 0, g[1]);
  // Not waiting_updates(): a waiting push leaves the count for a moment each
  // time its recheck deadline wakes it.
  EXPECT_FALSE(push_returned.load()) << "the push went ahead before the stream ended";
  EXPECT_EQ(cancels.load(), 0) << "a delivering stream was cancelled";
  PushResponse response;
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(slow->update), &response).ok());
  pusher.join();
  EXPECT_EQ(cancels.load(), 0);
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(pushed.version(), 2);
}

}  // namespace
}  // namespace pst
