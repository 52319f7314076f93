// The disk tier's contract: rows back bit for bit, atomic batches, a
// snapshot that later writes do not change, reads of ids never stored
// answered by the id filter, a fresh start, one tier a directory, and a
// full disk that fails the write and keeps what was stored.
#include "ps_server/core/disk_rows.h"

#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) { return FreshScratchDir(name); }

std::unique_ptr<DiskRows> OpenRows(const std::string& dir, size_t record_floats,
                                   std::shared_ptr<std::atomic<bool>> fail = nullptr) {
  absl::StatusOr<std::unique_ptr<DiskRows>> rows =
      DiskRows::Open({.dir = dir, .record_floats = record_floats, .name = "table \"t\" shard 0",
                      .fail_writes = std::move(fail)});
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? *std::move(rows) : nullptr;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

TEST(DiskRowsTest, ARowComesBackBitForBit) {
  std::unique_ptr<DiskRows> rows = OpenRows(FreshDir("disk_rows_bits"), 4);
  ASSERT_NE(rows, nullptr);
  const std::vector<float> record = {-0.0f, std::numeric_limits<float>::denorm_min(),
                                     1.0f / 3.0f, -std::numeric_limits<float>::max()};
  DiskRows::Batch batch;
  batch.Put(~uint64_t{0}, record, int64_t{1} << 40, -5);
  ASSERT_TRUE(rows->Write(batch).ok());
  DiskRow row;
  ASSERT_EQ(rows->Get(~uint64_t{0}, &row).value(), true);
  EXPECT_EQ(Bits(row.record), Bits(record));
  EXPECT_EQ(row.updates, int64_t{1} << 40);
  EXPECT_EQ(row.touched, -5);
  EXPECT_EQ(rows->Get(7, &row).value(), false);
  EXPECT_EQ(rows->size(), 1);
  EXPECT_GT(rows->bytes(), 0);
}

TEST(DiskRowsTest, ASnapshotKeepsTheRowsOfItsTime) {
  std::unique_ptr<DiskRows> rows = OpenRows(FreshDir("disk_rows_snapshot"), 1);
  ASSERT_NE(rows, nullptr);
  DiskRows::Batch first;
  for (uint64_t id : {3, 1, 2}) first.Put(id, std::vector<float>{float(id)}, 0, 0);
  ASSERT_TRUE(rows->Write(first).ok());
  DiskRows::Snapshot snapshot = rows->TakeSnapshot();
  DiskRows::Batch later;
  later.Delete(1);
  later.Put(9, std::vector<float>{9}, 0, 0);
  ASSERT_TRUE(rows->Write(later).ok());
  std::map<uint64_t, float> seen;
  std::vector<uint64_t> order;
  ASSERT_TRUE(snapshot
                  .ForEach([&](uint64_t id, const DiskRow& row) {
                    seen[id] = row.record[0];
                    order.push_back(id);
                  })
                  .ok());
  EXPECT_EQ(seen, (std::map<uint64_t, float>{{1, 1}, {2, 2}, {3, 3}}));
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3}));  // in id order
  EXPECT_EQ(snapshot.size(), 3);
  EXPECT_EQ(rows->size(), 3);
  order.clear();
  ASSERT_TRUE(rows->ForEach([&](uint64_t id, const DiskRow&) { order.push_back(id); }).ok());
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 3, 9}));
}

TEST(DiskRowsTest, IdsNeverStoredAreAnsweredWithoutRocksDbAndStoredOnesAreRead) {
  std::unique_ptr<DiskRows> rows = OpenRows(FreshDir("disk_rows_filter"), 1);
  ASSERT_NE(rows, nullptr);
  // Stored ids: every fourth of 0..40 000 (several flushes' worth of
  // batches), one of them deleted again.
  for (uint64_t first = 0; first < 40000; first += 4000) {
    DiskRows::Batch batch;
    for (uint64_t id = first; id < first + 4000; id += 4)
      batch.Put(id, std::vector<float>{float(id)}, 0, 0);
    ASSERT_TRUE(rows->Write(batch).ok());
  }
  DiskRows::Batch gone;
  gone.Delete(8);
  ASSERT_TRUE(rows->Write(gone).ok());

  std::vector<uint64_t> ids(40000);
  for (uint64_t id = 0; id < ids.size(); ++id) ids[id] = id;
  std::vector<DiskRow> read(ids.size());
  std::unique_ptr<bool[]> found(new bool[ids.size()]);
  ASSERT_TRUE(rows->GetSorted(ids, read, std::span<bool>(found.get(), ids.size())).ok());
  for (uint64_t id = 0; id < ids.size(); ++id) {
    ASSERT_EQ(found[id], id % 4 == 0 && id != 8) << id;
    if (found[id]) {
      EXPECT_EQ(read[id].record, std::vector<float>{float(id)}) << id;
    }
  }
  // Of the 30 000 ids never stored, nearly all were answered by the filter.
  EXPECT_GT(rows->reads_filtered(), 29000);
  EXPECT_LE(rows->reads_filtered(), 30000);

  const int64_t before = rows->reads_filtered();
  DiskRow row;
  EXPECT_EQ(rows->Get(4, &row).value(), true);
  EXPECT_EQ(rows->Get(8, &row).value(), false);  // deleted: RocksDB says so
  EXPECT_EQ(rows->reads_filtered(), before);
  int64_t filtered = 0;
  for (uint64_t id = 1'000'000; id < 1'001'000; ++id) {
    EXPECT_EQ(rows->Get(id, &row).value(), false);
    filtered += !rows->MayHold(id);
  }
  EXPECT_EQ(rows->reads_filtered(), before + filtered);
  EXPECT_GT(filtered, 950);
  EXPECT_GT(rows->filter_bytes(), 0);
}

TEST(DiskRowsTest, OpenStartsEmptyWhateverTheDirectoryHeld) {
  const std::string dir = FreshDir("disk_rows_fresh");
  {
    std::unique_ptr<DiskRows> rows = OpenRows(dir, 1);
    ASSERT_NE(rows, nullptr);
    DiskRows::Batch batch;
    batch.Put(1, std::vector<float>{1}, 0, 0);
    ASSERT_TRUE(rows->Write(batch).ok());
  }
  std::ofstream(dir + "/stray") << "left by someone";
  std::unique_ptr<DiskRows> rows = OpenRows(dir, 1);
  ASSERT_NE(rows, nullptr);
  DiskRow row;
  EXPECT_EQ(rows->Get(1, &row).value(), false);
  EXPECT_FALSE(std::filesystem::exists(dir + "/stray"));
}

TEST(DiskRowsTest, ASecondTierOnALiveTiersDirectoryIsRefusedAndEmptiesNothing) {
  const std::string dir = FreshDir("disk_rows_twice");
  std::unique_ptr<DiskRows> first = OpenRows(dir, 1);
  ASSERT_NE(first, nullptr);
  DiskRows::Batch batch;
  batch.Put(1, std::vector<float>{1}, 0, 0);
  ASSERT_TRUE(first->Write(batch).ok());

  absl::StatusOr<std::unique_ptr<DiskRows>> second = DiskRows::Open(
      {.dir = dir, .record_floats = 1, .name = "table \"t\" shard 0", .fail_writes = nullptr});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(dir));
  EXPECT_TRUE(std::filesystem::exists(dir + "/CURRENT"));  // the first's database, untouched
  DiskRow row;
  EXPECT_EQ(first->Get(1, &row).value(), true);

  first.reset();  // the directory is free again
  EXPECT_NE(OpenRows(dir, 1), nullptr);
}

TEST(DiskRowsTest, AFullDiskFailsTheWholeBatchAndKeepsTheRowsStored) {
  const std::string dir = FreshDir("disk_rows_full");
  auto fail = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<DiskRows> rows = OpenRows(dir, 1, fail);
  ASSERT_NE(rows, nullptr);
  DiskRows::Batch kept;
  kept.Put(1, std::vector<float>{1}, 0, 0);
  ASSERT_TRUE(rows->Write(kept).ok());

  fail->store(true);
  DiskRows::Batch refused;
  refused.Put(2, std::vector<float>{2}, 0, 0);
  refused.Delete(1);
  const absl::Status s = rows->Write(refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("table \"t\" shard 0"));
  EXPECT_THAT(s.message(), HasSubstr(dir));
  DiskRow row;
  EXPECT_EQ(rows->Get(1, &row).value(), true);  // reads go on
  EXPECT_EQ(rows->Get(2, &row).value(), false);
  EXPECT_EQ(rows->size(), 1);

  fail->store(false);  // room again: the next write goes through
  const absl::Status again = rows->Write(refused);
  ASSERT_TRUE(again.ok()) << again;
  EXPECT_EQ(rows->Get(2, &row).value(), true);
  EXPECT_EQ(rows->Get(1, &row).value(), false);
  EXPECT_EQ(rows->size(), 1);
}

TEST(DiskRowsTest, OpenSaysWhichDirectoryItCannotUse) {
  const std::string file = FreshDir("disk_rows_not_a_dir");
  std::ofstream(file) << "a file";
  absl::StatusOr<std::unique_ptr<DiskRows>> rows =
      DiskRows::Open({.dir = file + "/t-shard0", .record_floats = 1, .name = "table \"t\" shard 0",
                      .fail_writes = nullptr});
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(rows.status().message(), HasSubstr(file + "/t-shard0"));
  std::filesystem::remove(file);
}

}  // namespace PST_FILE_ID
}  // namespace pst
