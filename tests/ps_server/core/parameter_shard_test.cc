// The update semantics of one PS shard, without a network.
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"

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
#include "ps_server/core/streamed_update.h"
#include "tests/ps_server/core/parameter_shard_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

using namespace shard_testing;  // NOLINT(build/namespaces)

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

}  // namespace PST_FILE_ID
}  // namespace pst
