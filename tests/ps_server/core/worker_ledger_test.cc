// The shard's worker ledger on its own: clocks and staleness of accepted
// pushes and their undo, drops, done and rejoin, the count of standing
// changes, and a lease that runs out on a manual clock.
#include "ps_server/core/worker_ledger.h"

#include "gtest/gtest.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

constexpr absl::Duration kLease = absl::Seconds(5);

class WorkerLedgerTest : public ::testing::Test {
 protected:
  WorkerLedgerTest()
      : ledger_(
            3, /*shard=*/0, kLease, &mu_,
            [this] {
              mu_.AssertHeld();
              ++left_;
            },
            clock_) {}

  StatsResponse Stats() {
    absl::MutexLock lock(&mu_);
    StatsResponse stats;
    ledger_.FillStats(&stats);
    return stats;
  }

  absl::Mutex mu_;
  ManualLeaseClock clock_;
  int left_ = 0;  // guarded by mu_
  WorkerLedger ledger_;
};

TEST_F(WorkerLedgerTest, APushAdvancesItsWorkersClockAndStaleness) {
  {
    absl::MutexLock lock(&mu_);
    ledger_.RecordPush(1, /*computed_at=*/4, /*staleness=*/2);
    ledger_.RecordPush(1, /*computed_at=*/6, /*staleness=*/0);
    ledger_.RecordPush(2, /*computed_at=*/6, /*staleness=*/1);
    ledger_.CountDropped(2);
  }
  StatsResponse stats = Stats();
  ASSERT_EQ(stats.workers_size(), 3);
  EXPECT_EQ(stats.workers(1).clock(), 2);
  EXPECT_EQ(stats.workers(1).last_step(), 6);
  EXPECT_EQ(stats.workers(1).last_staleness(), 0);
  EXPECT_EQ(stats.workers(1).max_staleness(), 2);
  EXPECT_EQ(stats.workers(2).dropped(), 1);
  EXPECT_EQ(stats.workers(0).last_step(), -1);
  EXPECT_DOUBLE_EQ(stats.mean_staleness(), 1.0);
  EXPECT_EQ(stats.clock_spread(), 2);  // worker 0 has pushed nothing
}

TEST_F(WorkerLedgerTest, AnUndoneRecordLeavesNoTrace) {
  absl::MutexLock lock(&mu_);
  ledger_.RecordPush(0, 3, 1);
  StatsResponse before;
  ledger_.FillStats(&before);
  const WorkerLedger::Mark mark = ledger_.RecordPush(0, 9, 7);
  ledger_.Undo(mark);
  StatsResponse after;
  ledger_.FillStats(&after);
  EXPECT_EQ(after.workers(0).clock(), before.workers(0).clock());
  EXPECT_EQ(after.workers(0).last_step(), 3);
  EXPECT_EQ(after.workers(0).max_staleness(), 1);
  EXPECT_DOUBLE_EQ(after.mean_staleness(), before.mean_staleness());
}

TEST_F(WorkerLedgerTest, DoneAndRejoinCountAsChangesOnlyWhenTheyChangeSomething) {
  absl::MutexLock lock(&mu_);
  const int64_t start = ledger_.changes();
  EXPECT_FALSE(ledger_.Rejoin(0));
  EXPECT_TRUE(ledger_.Finish(0));
  EXPECT_FALSE(ledger_.Finish(0));
  EXPECT_EQ(ledger_.done_count(), 1);
  EXPECT_FALSE(ledger_.AllDone());
  EXPECT_TRUE(ledger_.Finish(1));
  EXPECT_TRUE(ledger_.Finish(2));
  EXPECT_TRUE(ledger_.AllDone());
  EXPECT_TRUE(ledger_.Rejoin(1));
  EXPECT_FALSE(ledger_.AllDone());
  EXPECT_EQ(ledger_.changes(), start + 4);
}

TEST_F(WorkerLedgerTest, AdmittedRanksAreClearedWhenTheStepCompletes) {
  absl::MutexLock lock(&mu_);
  ledger_.Admit(2);
  EXPECT_TRUE(ledger_.progress()[2].pushed);
  ledger_.StepCompleted();
  EXPECT_FALSE(ledger_.progress()[2].pushed);
}

TEST_F(WorkerLedgerTest, ClocksSurviveACheckpoint) {
  ShardCheckpoint checkpoint;
  {
    absl::MutexLock lock(&mu_);
    ledger_.RecordPush(0, 0, 0);
    ledger_.RecordPush(2, 0, 0);
    ledger_.RecordPush(2, 1, 0);
    ledger_.ExportClocks(&checkpoint);
  }
  absl::Mutex mu;
  WorkerLedger restored(3, 0, kLease, &mu, [] {}, clock_);
  absl::MutexLock lock(&mu);
  restored.RestoreClocks(checkpoint);
  EXPECT_EQ(restored.clock(0), 1);
  EXPECT_EQ(restored.clock(1), 0);
  EXPECT_EQ(restored.clock(2), 2);
}

TEST_F(WorkerLedgerTest, ASilentWorkerLeavesTheLiveSetAndComesBackWhenHeard) {
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(ledger_.Heard(1));   // first heard from
    EXPECT_FALSE(ledger_.Heard(1));  // again: nothing changes
  }
  const int64_t before = Stats().worker_changes();
  clock_.Advance(kLease + absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu_);
    return left_ == 1;
  })) << "the lease never ran out";
  {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(ledger_.live(1));
    EXPECT_FALSE(ledger_.progress()[1].live);
    EXPECT_TRUE(ledger_.progress()[0].live);  // never heard from: still starting
    EXPECT_EQ(ledger_.changes(), before + 1);
    EXPECT_TRUE(ledger_.Heard(1));  // back
    EXPECT_TRUE(ledger_.live(1));
    EXPECT_TRUE(ledger_.progress()[1].live);
  }
  // Stats calls live only a worker heard from: 0 and 2 never were.
  const StatsResponse stats = Stats();
  EXPECT_EQ(stats.live_workers(), 1);
  EXPECT_FALSE(stats.workers(0).live());
  EXPECT_TRUE(stats.workers(1).live());
}

// A worker never heard from is not live in Stats, though the policy still
// waits for it (it may be starting), and SSP's spread still spans it.
TEST_F(WorkerLedgerTest, AWorkerNeverHeardFromIsNotLiveInStats) {
  {
    absl::MutexLock lock(&mu_);
    ledger_.Heard(1);
    ledger_.RecordPush(1, /*computed_at=*/0, /*staleness=*/0);
    EXPECT_TRUE(ledger_.progress()[0].live);
  }
  const StatsResponse stats = Stats();
  EXPECT_EQ(stats.live_workers(), 1);
  EXPECT_FALSE(stats.workers(0).live());
  EXPECT_EQ(stats.workers(0).seconds_since_seen(), -1.0);
  EXPECT_TRUE(stats.workers(1).live());
  EXPECT_EQ(stats.clock_spread(), 1);
}

}  // namespace PST_FILE_ID
}  // namespace pst
