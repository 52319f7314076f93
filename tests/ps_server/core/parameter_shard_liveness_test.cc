// Liveness on the lease tracker's timer, and AwaitWorkersDone.
#include "ps_server/core/parameter_shard.h"

#include <atomic>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/parameter_shard_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace shard_testing;  // NOLINT(build/namespaces)

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
    ++sleepers_;
    do {
      cv->Wait(mu);
    } while (held_.load());
    --sleepers_;
  }
  // Trackers asleep here, held: once one is, moving the time cannot wake it.
  int sleepers() const { return sleepers_.load(); }
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
  mutable std::atomic<int> sleepers_{0};
};

// Stats is a read: however often it is called, a lease that has run out
// (which Stats reports) completes no step and leaves the live set alone.
TEST(LivenessTest, StatsChangesNothing) {
  HeldClock clock;
  auto shard = SyncStepWaitingForWorker1(&clock);
  absl::Cleanup release = [&] { clock.Release(); };  // before the shard goes
  // A tracker that has not gone to sleep yet would see the new time and act.
  ASSERT_TRUE(Eventually([&] { return clock.sleepers() == 1; })) << "the tracker never slept";
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

}  // namespace PST_FILE_ID
}  // namespace pst
