// Reading a disk tier ahead: rows come back bit for bit, once each when
// taken; a forgotten id is read again by its caller, never served stale;
// the room and age bounds hold.
#include "ps_server/core/row_prefetch.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

using Outcome = RowPrefetch::Outcome;

std::unique_ptr<DiskRows> OpenRows(const std::string& name) {
  const std::string dir = FreshScratchDir(name);
  absl::StatusOr<std::unique_ptr<DiskRows>> rows = DiskRows::Open(
      {.dir = dir, .record_floats = 2, .name = "table \"t\" shard 0", .fail_writes = nullptr});
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? *std::move(rows) : nullptr;
}

// Stores ids with record {id, -id}, update count id and tick 2 * id.
void Store(DiskRows& rows, const std::vector<uint64_t>& ids) {
  DiskRows::Batch batch;
  for (uint64_t id : ids) {
    const float value = static_cast<float>(id);
    const std::vector<float> record = {value, -value};
    batch.Put(id, record, static_cast<int64_t>(id), 2 * static_cast<int64_t>(id));
  }
  ASSERT_TRUE(rows.Write(batch).ok());
}

// Waits for every read requested so far: a Read of the last id requested
// waits for it, and reads land in request order.
void AwaitReads(RowPrefetch& prefetch, uint64_t last_requested) {
  DiskRow row;
  EXPECT_NE(prefetch.Read(last_requested, &row).outcome, Outcome::kAbsent);
}

TEST(RowPrefetchTest, RequestedRowsAreReadAheadAndTakenOnce) {
  std::unique_ptr<DiskRows> disk = OpenRows("prefetch_take");
  ASSERT_NE(disk, nullptr);
  Store(*disk, {1, 2, 3});
  RowPrefetch prefetch(disk.get(), 16, 4);
  prefetch.Request({{1, 2, 3, 9}}, 0);
  AwaitReads(prefetch, 9);
  EXPECT_EQ(prefetch.prefetched(), 4);
  DiskRow row;
  RowPrefetch::Answer answer = prefetch.Read(2, &row);  // left for a Take
  EXPECT_EQ(answer.outcome, Outcome::kReady);
  EXPECT_TRUE(answer.found);
  answer = prefetch.Take(2, &row);
  EXPECT_EQ(answer.outcome, Outcome::kReady);
  ASSERT_TRUE(answer.found);
  EXPECT_EQ(row.record, (std::vector<float>{2.0f, -2.0f}));
  EXPECT_EQ(row.updates, 2);
  EXPECT_EQ(row.touched, 4);
  EXPECT_EQ(prefetch.Take(2, &row).outcome, Outcome::kAbsent);  // taken already
  // An id the tier does not hold is answered as such: its initial value.
  answer = prefetch.Take(9, &row);
  EXPECT_EQ(answer.outcome, Outcome::kReady);
  EXPECT_FALSE(answer.found);
  EXPECT_TRUE(answer.status.ok());
  EXPECT_EQ(prefetch.Take(7, &row).outcome, Outcome::kAbsent);  // never requested
  EXPECT_EQ(prefetch.size(), 2);
}

TEST(RowPrefetchTest, AForgottenIdIsNeverServedFromBeforeItsWrite) {
  std::unique_ptr<DiskRows> disk = OpenRows("prefetch_forget");
  ASSERT_NE(disk, nullptr);
  Store(*disk, {1, 2});
  RowPrefetch prefetch(disk.get(), 16, 4);
  prefetch.Request({{1, 2}}, 0);
  AwaitReads(prefetch, 2);
  // The owner's rule: forget, then write (id 1 promoted, so deleted).
  prefetch.Forget({{1}});
  DiskRows::Batch batch;
  batch.Delete(1);
  ASSERT_TRUE(disk->Write(batch).ok());
  DiskRow row;
  EXPECT_EQ(prefetch.Take(1, &row).outcome, Outcome::kAbsent);
  EXPECT_EQ(prefetch.Take(2, &row).outcome, Outcome::kReady);
  // Forgotten while its read may be in flight, then asked for again: the
  // answer is the row after the write, whichever read lands first.
  for (int round = 0; round < 50; ++round) {
    const float value = static_cast<float>(round);
    prefetch.Request({{5}}, 0);
    prefetch.Forget({{5}});
    if (round > 0) {
      DiskRows::Batch remove;
      remove.Delete(5);
      ASSERT_TRUE(disk->Write(remove).ok());
    }
    DiskRows::Batch put;
    put.Put(5, std::vector<float>{value, value}, round, round);
    ASSERT_TRUE(disk->Write(put).ok());
    prefetch.Request({{5}}, 0);
    const RowPrefetch::Answer answer = prefetch.Take(5, &row);
    ASSERT_NE(answer.outcome, Outcome::kAbsent);
    ASSERT_TRUE(answer.found);
    EXPECT_EQ(row.record, (std::vector<float>{value, value})) << "round " << round;
  }
}

TEST(RowPrefetchTest, IdsPastTheRoomAreSkippedAndOldRowsDropped) {
  std::unique_ptr<DiskRows> disk = OpenRows("prefetch_bounds");
  ASSERT_NE(disk, nullptr);
  Store(*disk, {1, 2, 3, 4});
  RowPrefetch prefetch(disk.get(), 2, 3);
  prefetch.Request({{1, 2, 3}}, 10);
  EXPECT_EQ(prefetch.skipped(), 1);
  EXPECT_EQ(prefetch.size(), 2);
  AwaitReads(prefetch, 2);
  DiskRow row;
  EXPECT_EQ(prefetch.Take(3, &row).outcome, Outcome::kAbsent);
  // Requested again, id 1 keeps its place and is not read twice.
  prefetch.Request({{1}}, 12);
  EXPECT_EQ(prefetch.size(), 2);
  // Three ticks on, id 2 (tick 10) is dropped; id 1 (tick 12) stays.
  prefetch.Request({{4}}, 14);
  EXPECT_EQ(prefetch.Read(2, &row).outcome, Outcome::kAbsent);
  EXPECT_NE(prefetch.Read(1, &row).outcome, Outcome::kAbsent);
  EXPECT_NE(prefetch.Read(4, &row).outcome, Outcome::kAbsent);
  EXPECT_EQ(prefetch.prefetched(), 3);
}

}  // namespace PST_FILE_ID
}  // namespace pst
