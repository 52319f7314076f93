// The shard's snapshot schedule on its own: which versions are due, a
// snapshot handed to its taker, and the hold on updates while an attached
// writer has not written it.
#include "ps_server/core/snapshot_schedule.h"

#include <thread>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

ShardSnapshot At(int64_t version) {
  ShardSnapshot snapshot;
  snapshot.checkpoint.set_version(version);
  return snapshot;
}

TEST(SnapshotScheduleTest, EveryNthVersionIsDueAndZeroMeansNever) {
  absl::Mutex mu;
  SnapshotSchedule every3(3, &mu), never(0, &mu);
  EXPECT_FALSE(every3.Due(1));
  EXPECT_FALSE(every3.Due(2));
  EXPECT_TRUE(every3.Due(3));
  EXPECT_TRUE(every3.Due(6));
  EXPECT_FALSE(never.Due(3));
  EXPECT_FALSE(never.Due(0));
}

TEST(SnapshotScheduleTest, UpdatesAreHeldOnlyWhileAnAttachedWriterHasNotWritten) {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  SnapshotSchedule schedule(2, &mu);
  schedule.Schedule(At(2));
  EXPECT_FALSE(schedule.holds_updates());  // no writer: nothing to wait for
  schedule.AttachWriter();
  schedule.Schedule(At(4));
  EXPECT_TRUE(schedule.holds_updates());
  schedule.Written();
  EXPECT_FALSE(schedule.holds_updates());
  schedule.Schedule(At(6));
  EXPECT_TRUE(schedule.holds_updates());
  schedule.DetachWriter();
  EXPECT_FALSE(schedule.holds_updates());
  schedule.Schedule(At(8));
  EXPECT_FALSE(schedule.holds_updates());
}

TEST(SnapshotScheduleTest, TheTakerGetsTheNewestSnapshotOnce) {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  SnapshotSchedule schedule(1, &mu);
  schedule.Schedule(At(1));
  schedule.Schedule(At(2));  // replaces the one not taken
  std::optional<ShardSnapshot> taken = schedule.Take(absl::InfiniteFuture(), [] { return false; });
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->checkpoint.version(), 2);
  EXPECT_FALSE(schedule.Take(absl::Now(), [] { return false; }).has_value());
}

TEST(SnapshotScheduleTest, AWaitingTakerWakesForASnapshotOrForStop) {
  absl::Mutex mu;
  SnapshotSchedule schedule(1, &mu);
  bool stop = false;  // guarded by mu
  std::optional<ShardSnapshot> taken;
  std::thread taker([&] {
    absl::MutexLock lock(&mu);
    taken = schedule.Take(absl::InfiniteFuture(), [&] { return stop; });
  });
  {
    absl::MutexLock lock(&mu);
    schedule.Schedule(At(7));
  }
  taker.join();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->checkpoint.version(), 7);

  std::thread stopped([&] {
    absl::MutexLock lock(&mu);
    taken = schedule.Take(absl::InfiniteFuture(), [&] { return stop; });
  });
  {
    absl::MutexLock lock(&mu);
    stop = true;
    schedule.Wake();
  }
  stopped.join();
  EXPECT_FALSE(taken.has_value());
}

TEST(SnapshotScheduleTest, TheWriterStatsAreKept) {
  absl::Mutex mu;
  absl::MutexLock lock(&mu);
  SnapshotSchedule schedule(1, &mu);
  CheckpointStats stats;
  stats.set_written(3);
  schedule.set_stats(stats);
  EXPECT_EQ(schedule.stats().written(), 3);
}

}  // namespace PST_FILE_ID
}  // namespace pst
