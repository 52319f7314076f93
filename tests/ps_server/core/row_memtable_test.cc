// The disk tier's memtable answers as RocksDB's own skip list does: two
// databases, one on each, take the same random writes (ids written again
// and deleted, keys that share their first eight bytes, flushes while
// writing) and give the same point reads, at snapshots too, and the same
// scans in both directions and from any seek.
#include "ps_server/core/row_memtable.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/memtablerep.h"
#include "rocksdb/options.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

std::unique_ptr<rocksdb::DB> Open(const std::string& dir, bool row_memtable) {
  rocksdb::Options options;
  options.create_if_missing = true;
  // Small memtables, so that the writes below fill several.
  options.write_buffer_size = 64 << 10;
  options.memtable_whole_key_filtering = true;
  options.memtable_prefix_bloom_size_ratio = 0.1;
  if (row_memtable) {
    options.memtable_factory = NewRowMemtableFactory(/*buckets=*/64);
    options.allow_concurrent_memtable_write = false;
  }
  rocksdb::DB* db = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return std::unique_ptr<rocksdb::DB>(db);
}

// Ids as the disk tier writes them (8 bytes, big-endian), and keys of 3
// and 12 bytes that share their first bytes with them.
std::string KeyOf(uint64_t draw) {
  const uint64_t id = draw % 300;
  std::string key(8, '\0');
  for (int i = 0; i < 8; ++i) key[i] = static_cast<char>(id >> (56 - 8 * i));
  switch (draw % 7) {
    case 0:
      return key + "tail";
    case 1:
      return key.substr(0, 3);
    default:
      return key;
  }
}

std::vector<std::pair<std::string, std::string>> Scan(rocksdb::DB& db,
                                                      const rocksdb::Snapshot* snapshot,
                                                      bool backward) {
  rocksdb::ReadOptions read;
  read.snapshot = snapshot;
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(read));
  std::vector<std::pair<std::string, std::string>> rows;
  for (backward ? it->SeekToLast() : it->SeekToFirst(); it->Valid();
       backward ? it->Prev() : it->Next()) {
    rows.emplace_back(it->key().ToString(), it->value().ToString());
  }
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  return rows;
}

// Where a seek to `target` lands and the two keys after it.
std::vector<std::string> SeekFrom(rocksdb::DB& db, const std::string& target, bool for_prev) {
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(rocksdb::ReadOptions()));
  for_prev ? it->SeekForPrev(target) : it->Seek(target);
  std::vector<std::string> keys;
  for (int i = 0; i < 3 && it->Valid(); ++i) {
    keys.push_back(it->key().ToString());
    for_prev ? it->Prev() : it->Next();
  }
  return keys;
}

std::string Get(rocksdb::DB& db, const std::string& key, const rocksdb::Snapshot* snapshot) {
  rocksdb::ReadOptions read;
  read.snapshot = snapshot;
  std::string value;
  const rocksdb::Status s = db.Get(read, key, &value);
  if (s.IsNotFound()) return "<none>";
  EXPECT_TRUE(s.ok()) << s.ToString();
  return value;
}

TEST(RowMemtableTest, AnswersAsRocksDbsSkipList) {
  std::unique_ptr<rocksdb::DB> rows = Open(FreshScratchDir("row_memtable_rows"), true);
  std::unique_ptr<rocksdb::DB> skip_list = Open(FreshScratchDir("row_memtable_skip"), false);
  ASSERT_NE(rows, nullptr);
  ASSERT_NE(skip_list, nullptr);
  rocksdb::DB* dbs[] = {rows.get(), skip_list.get()};
  std::mt19937_64 draw(11);
  // Each snapshot taken on both, at the same point of the writes.
  std::vector<std::pair<const rocksdb::Snapshot*, const rocksdb::Snapshot*>> snapshots;
  for (int op = 0; op < 6000; ++op) {
    const std::string key = KeyOf(draw());
    const bool remove = draw() % 5 == 0;
    const std::string value(8 + draw() % 120, static_cast<char>('a' + op % 26));
    for (rocksdb::DB* db : dbs) {
      const rocksdb::Status s = remove ? db->Delete(rocksdb::WriteOptions(), key)
                                       : db->Put(rocksdb::WriteOptions(), key, value);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    if (op % 700 == 0) snapshots.emplace_back(rows->GetSnapshot(), skip_list->GetSnapshot());
    if (op % 1100 == 0) {
      ASSERT_TRUE(rows->Flush(rocksdb::FlushOptions()).ok());
    }
    if (op % 500 != 499) continue;
    SCOPED_TRACE("after write " + std::to_string(op));
    ASSERT_EQ(Scan(*rows, nullptr, false), Scan(*skip_list, nullptr, false));
    ASSERT_EQ(Scan(*rows, nullptr, true), Scan(*skip_list, nullptr, true));
    for (const auto& [at_rows, at_skip_list] : snapshots) {
      ASSERT_EQ(Scan(*rows, at_rows, false), Scan(*skip_list, at_skip_list, false));
    }
    for (uint64_t k = 0; k < 2100; ++k) {
      const std::string probe = KeyOf(k);
      ASSERT_EQ(Get(*rows, probe, nullptr), Get(*skip_list, probe, nullptr)) << k;
      const auto& [at_rows, at_skip_list] = snapshots[k % snapshots.size()];
      ASSERT_EQ(Get(*rows, probe, at_rows), Get(*skip_list, probe, at_skip_list)) << k;
    }
    for (int s = 0; s < 50; ++s) {
      const std::string target = KeyOf(draw()) + (s % 2 == 0 ? "" : "\x01");
      ASSERT_EQ(SeekFrom(*rows, target, false), SeekFrom(*skip_list, target, false));
      ASSERT_EQ(SeekFrom(*rows, target, true), SeekFrom(*skip_list, target, true));
    }
  }
  for (const auto& [at_rows, at_skip_list] : snapshots) {
    rows->ReleaseSnapshot(at_rows);
    skip_list->ReleaseSnapshot(at_skip_list);
  }
  // The scans above read memtables flushed (by size and by hand) into
  // sorted files, in the order this memtable gave them.
  uint64_t sorted_bytes = 0;
  ASSERT_TRUE(rows->GetIntProperty("rocksdb.total-sst-files-size", &sorted_bytes));
  EXPECT_GT(sorted_bytes, 0u);
}

// Point reads on another thread while one writes and memtables are
// flushed, as the tier's read-ahead reads beside the shard's writes: each
// read finds a whole value, and a key's values never go back in time.
TEST(RowMemtableTest, ReadsBesideTheWriterSeeEachKeyMoveForward) {
  std::unique_ptr<rocksdb::DB> db = Open(FreshScratchDir("row_memtable_concurrent"), true);
  ASSERT_NE(db, nullptr);
  constexpr uint64_t kKeys = 64;
  constexpr int kWrites = 20000;
  std::atomic<bool> written{false};
  std::atomic<int64_t> reads{0};
  std::vector<std::string> failures;
  std::thread reader([&] {
    std::vector<int64_t> seen(kKeys, -1);
    std::mt19937_64 draw(3);
    while (!written.load(std::memory_order_acquire) || reads.load() < 1000) {
      const uint64_t k = draw() % kKeys;
      std::string value;
      const rocksdb::Status s = db->Get(rocksdb::ReadOptions(), KeyOf(k * 7 + 2), &value);
      reads.fetch_add(1);
      if (s.IsNotFound()) {
        if (seen[k] >= 0) failures.push_back("key " + std::to_string(k) + " vanished");
        continue;
      }
      // The value: the write's number, then padding of its own digit.
      const int64_t version = std::stoll(value.substr(0, value.find(':')));
      if (value.size() != 100 || version < seen[k]) {
        failures.push_back("key " + std::to_string(k) + ": " + value.substr(0, 12) + " after " +
                           std::to_string(seen[k]));
      }
      seen[k] = version;
    }
  });
  rocksdb::Status written_status;
  for (int write = 0; write < kWrites && written_status.ok(); ++write) {
    std::string value = std::to_string(write) + ":";
    value.resize(100, static_cast<char>('0' + write % 10));
    written_status = db->Put(rocksdb::WriteOptions(), KeyOf((write % kKeys) * 7 + 2), value);
  }
  written.store(true, std::memory_order_release);
  reader.join();
  ASSERT_TRUE(written_status.ok()) << written_status.ToString();
  EXPECT_TRUE(failures.empty()) << failures.size() << " bad reads, the first: " << failures[0];
  uint64_t sorted_bytes = 0;
  ASSERT_TRUE(db->GetIntProperty("rocksdb.total-sst-files-size", &sorted_bytes));
  EXPECT_GT(sorted_bytes, 0u);  // memtables were flushed while it read
}

}  // namespace PST_FILE_ID
}  // namespace pst
