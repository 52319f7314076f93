#include "ps_server/core/disk_rows.h"

#include <bit>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/file_lock.h"
#include "ps_server/core/row_memtable.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace pst {

// The value layout copies floats and int64s as they lie in memory.
static_assert(std::endian::native == std::endian::little,
              "the disk tier stores little-endian numbers as they lie in memory");

namespace {

constexpr size_t kHeaderBytes = 2 * sizeof(int64_t);

// Big-endian, so that iteration (and a checkpoint's disk rows) go in id
// order.
std::string Key(uint64_t id) {
  std::string key(sizeof(id), '\0');
  for (int i = 0; i < 8; ++i) key[i] = static_cast<char>(id >> (56 - 8 * i));
  return key;
}

uint64_t IdOf(const rocksdb::Slice& key) {
  uint64_t id = 0;
  for (size_t i = 0; i < sizeof(id) && i < key.size(); ++i) {
    id = (id << 8) | static_cast<unsigned char>(key[i]);
  }
  return id;
}

bool ParseValue(const rocksdb::Slice& value, size_t record_floats, DiskRow* row) {
  if (value.size() != kHeaderBytes + record_floats * sizeof(float)) return false;
  std::memcpy(&row->updates, value.data(), sizeof(row->updates));
  std::memcpy(&row->touched, value.data() + sizeof(row->updates), sizeof(row->touched));
  row->record.resize(record_floats);
  std::memcpy(row->record.data(), value.data() + kHeaderBytes, record_floats * sizeof(float));
  return true;
}

// A writable file that fails every write while *fail is set, as on a full
// disk: the test's stand-in for a device that runs out of room.
class FailingFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FailingFile(std::unique_ptr<rocksdb::FSWritableFile> file,
              std::shared_ptr<std::atomic<bool>> fail)
      : FSWritableFileOwnerWrapper(std::move(file)), fail_(std::move(fail)) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    if (fail_->load()) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    if (fail_->load()) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }

 private:
  const std::shared_ptr<std::atomic<bool>> fail_;
};

class FailingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FailingFileSystem(std::shared_ptr<std::atomic<bool>> fail)
      : FileSystemWrapper(rocksdb::FileSystem::Default()), fail_(std::move(fail)) {}
  const char* Name() const override { return "PstFailingFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* file,
                                    rocksdb::IODebugContext* dbg) override {
    if (fail_->load()) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    std::unique_ptr<rocksdb::FSWritableFile> real;
    rocksdb::IOStatus s = target()->NewWritableFile(name, options, &real, dbg);
    if (s.ok()) *file = std::make_unique<FailingFile>(std::move(real), fail_);
    return s;
  }

 private:
  const std::shared_ptr<std::atomic<bool>> fail_;
};

}  // namespace

struct DiskRows::Db {
  ~Db() { delete db; }  // before the env it writes through, and the lock
  std::optional<FileLock> lock;
  std::unique_ptr<rocksdb::Env> env;  // only with injected faults
  rocksdb::DB* db = nullptr;
  size_t record_floats = 0;
  std::string name;
};

DiskRows::DiskRows(DiskRowsOptions options, std::shared_ptr<Db> db)
    : options_(std::move(options)), db_(std::move(db)) {}

DiskRows::~DiskRows() = default;

absl::StatusOr<std::unique_ptr<DiskRows>> DiskRows::Open(DiskRowsOptions options) {
  auto failed = [&](absl::string_view what) {
    return absl::InternalError(absl::StrCat(options.name, ": cannot open its disk tier in ",
                                            options.dir, ": ", what));
  };
  std::error_code error;
  std::filesystem::create_directories(options.dir, error);
  if (error) return failed(error.message());
  // Held for the tier's life: a live process's tier is never emptied under
  // it by another pointed at the same folder.
  absl::StatusOr<FileLock> lock =
      FileLock::HoldDirectory(options.dir, absl::StrCat(options.name, "'s disk tier"));
  if (!lock.ok()) return lock.status();
  // The tier caches rows of this process only; what an earlier process
  // left is stale (a restore refills the tier from the checkpoint).
  for (std::filesystem::directory_iterator entry(options.dir, error), end; !error && entry != end;
       entry.increment(error)) {
    std::filesystem::remove_all(entry->path(), error);
    if (error) return failed(absl::StrCat("removing its old files: ", error.message()));
  }
  if (error) return failed(absl::StrCat("listing its old files: ", error.message()));

  auto db = std::make_shared<Db>();
  db->lock.emplace(*std::move(lock));
  db->record_floats = options.record_floats;
  db->name = options.name;
  rocksdb::Options rocks;
  rocks.create_if_missing = true;
  rocks.error_if_exists = true;
  // Floats compress little; the CPU is the training's.
  rocks.compression = rocksdb::kNoCompression;
  // RAM outside the table's budget: two memtables of 8 MiB (and their
  // hash buckets, below) and a block cache of 8 MiB, so that a tiny budget
  // stays small.
  rocks.write_buffer_size = 8 << 20;
  rocks.max_write_buffer_number = 2;
  rocks.keep_log_file_num = 2;
  // Most reads that reach the memtables are of rows the tier does not
  // hold (ids never trained, or in RAM): a whole-key filter answers them
  // without a walk of the memtable's bucket.
  rocks.memtable_whole_key_filtering = true;
  rocks.memtable_prefix_bloom_size_ratio = 0.1;
  // The write-ahead log is never replayed (Open empties the tier), so a
  // write whose log append failed (a full disk) needs no stop of the
  // database: the write fails, nothing of it is applied, and the next
  // write goes on once there is room. A failed flush or compaction still
  // stops writes, until Resume (Write) or RocksDB's own recovery.
  rocks.paranoid_checks = false;
  // Demoted rows go into a memtable hashed by the whole key and sorted
  // once, as a vector, when it is flushed in the background (RowMemtable:
  // its header says why neither of RocksDB's own).
  rocks.memtable_factory = NewRowMemtableFactory(/*buckets=*/1 << 16);
  rocks.allow_concurrent_memtable_write = false;  // RowMemtable takes one writer
  // Demoted rows' ids are spread over the whole key range, so every
  // compaction of level 0 into level 1 rewrites all of level 1 (hundreds of
  // MB at a 10^7-row table). Letting 12 flushed files gather first, not 4,
  // rewrites it a third as often; a read then asks up to 12 files' filters
  // more, which costs less than the compactions saved (measured beside the
  // default trigger: 18 700 against 16 500 samples/s for the tiered CTR job,
  // its compactions 4 a run instead of 13). Writes slow at 24 files and
  // stop at 36 (RocksDB's defaults: 20 and 36), so a compaction running
  // behind holds the shard's demotions back no sooner than before.
  constexpr int kLevel0FilesPerCompaction = 12;
  rocks.level0_file_num_compaction_trigger = kLevel0FilesPerCompaction;
  rocks.level0_slowdown_writes_trigger = 2 * kLevel0FilesPerCompaction;
  rocks.level0_stop_writes_trigger = 3 * kLevel0FilesPerCompaction;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(8 << 20);
  // A pull of an id never trained asks the tier too; the filter answers
  // most such misses without reading a block.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  rocks.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  if (options.fail_writes != nullptr) {
    db->env = rocksdb::NewCompositeEnv(std::make_shared<FailingFileSystem>(options.fail_writes));
    rocks.env = db->env.get();
  }
  rocksdb::Status s = rocksdb::DB::Open(rocks, options.dir, &db->db);
  if (!s.ok()) return failed(s.ToString());
  return std::unique_ptr<DiskRows>(new DiskRows(std::move(options), std::move(db)));
}

int64_t DiskRows::bytes() const {
  uint64_t sst = 0, memtables = 0;
  db_->db->GetIntProperty("rocksdb.total-sst-files-size", &sst);
  db_->db->GetIntProperty("rocksdb.cur-size-all-mem-tables", &memtables);
  return static_cast<int64_t>(sst + memtables);
}

absl::StatusOr<bool> DiskRows::Get(uint64_t id, DiskRow* row) const {
  if (!stored_ids_.MayHold(id)) {
    reads_filtered_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  rocksdb::PinnableSlice value;
  rocksdb::Status s =
      db_->db->Get(rocksdb::ReadOptions(), db_->db->DefaultColumnFamily(), Key(id), &value);
  if (s.IsNotFound()) return false;
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat(options_.name, ": cannot read row ", id,
                                            " from its disk tier in ", options_.dir, ": ",
                                            s.ToString()));
  }
  if (!ParseValue(value, options_.record_floats, row)) {
    return absl::InternalError(absl::StrCat(options_.name, ": row ", id, " in its disk tier in ",
                                            options_.dir, " has ", value.size(),
                                            " bytes, not a row of this table"));
  }
  return true;
}

absl::Status DiskRows::GetSorted(std::span<const uint64_t> ids, std::span<DiskRow> rows,
                                 std::span<bool> found) const {
  // Only the ids the tier may hold go to RocksDB: asked[j] is ids' index.
  std::vector<size_t> asked;
  asked.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    found[i] = false;
    if (stored_ids_.MayHold(ids[i])) asked.push_back(i);
  }
  reads_filtered_.fetch_add(static_cast<int64_t>(ids.size() - asked.size()),
                            std::memory_order_relaxed);
  const size_t n = asked.size();
  if (n == 0) return absl::OkStatus();
  std::vector<std::string> keys(n);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t j = 0; j < n; ++j) {
    keys[j] = Key(ids[asked[j]]);
    slices[j] = keys[j];
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  // The rows read here go into RAM, where the next reads find them, so
  // their blocks are seldom read again from the tier: caching them only
  // fills the block cache (in the tiered CTR job the PS's peak RSS was
  // 458-461 MiB without, 490-502 MiB with, at the same speed).
  rocksdb::ReadOptions read;
  read.fill_cache = false;
  db_->db->MultiGet(read, db_->db->DefaultColumnFamily(), n, slices.data(), values.data(),
                    statuses.data(), /*sorted_input=*/true);
  for (size_t j = 0; j < n; ++j) {
    const size_t i = asked[j];
    found[i] = statuses[j].ok();
    if (statuses[j].IsNotFound()) continue;
    if (!statuses[j].ok()) {
      return absl::InternalError(absl::StrCat(options_.name, ": cannot read row ", ids[i],
                                              " from its disk tier in ", options_.dir, ": ",
                                              statuses[j].ToString()));
    }
    if (!ParseValue(values[j], options_.record_floats, &rows[i])) {
      return absl::InternalError(absl::StrCat(options_.name, ": row ", ids[i],
                                              " in its disk tier in ", options_.dir, " has ",
                                              values[j].size(), " bytes, not a row of this table"));
    }
  }
  return absl::OkStatus();
}

void DiskRows::Batch::Put(uint64_t id, std::span<const float> record, int64_t updates,
                          int64_t touched) {
  ids_.push_back(id);
  put_of_.push_back(static_cast<int64_t>(puts_.size()));
  puts_.push_back(
      {.updates = updates, .touched = touched, .at = records_.size(), .floats = record.size()});
  records_.insert(records_.end(), record.begin(), record.end());
}

void DiskRows::Batch::Replace(uint64_t id, std::span<const float> record, int64_t updates,
                              int64_t touched) {
  Put(id, record, updates, touched);
  ++replaces_;
}

void DiskRows::Batch::Delete(uint64_t id) {
  ids_.push_back(id);
  put_of_.push_back(-1);
}

absl::Status DiskRows::Write(const Batch& batch) {
  if (batch.empty()) return absl::OkStatus();
  if (write_failed_) {
    // After an I/O error RocksDB refuses writes until resumed; if the
    // cause is still there, the write below fails again and says so.
    db_->db->Resume().PermitUncheckedError();
  }
  // Before RocksDB holds them: a read that does not see an id here must
  // not find its row there (id_filter.h). A failed write leaves them
  // here, which costs a read each.
  for (size_t i = 0; i < batch.ids_.size(); ++i) {
    if (batch.put_of_[i] >= 0) stored_ids_.Add(batch.ids_[i]);
  }
  rocksdb::WriteBatch rows(batch.ids_.size() * 24 + batch.records_.size() * sizeof(float) +
                           batch.puts_.size() * kHeaderBytes);
  for (size_t i = 0; i < batch.ids_.size(); ++i) {
    const std::string key = Key(batch.ids_[i]);  // 8 bytes: no allocation
    const int64_t put = batch.put_of_[i];
    if (put < 0) {
      rows.Delete(key);
      continue;
    }
    const Batch::Stored& stored = batch.puts_[put];
    // The value: the counts, then the record (ParseValue's layout).
    const rocksdb::Slice parts[3] = {
        {reinterpret_cast<const char*>(&stored.updates), sizeof(stored.updates)},
        {reinterpret_cast<const char*>(&stored.touched), sizeof(stored.touched)},
        {reinterpret_cast<const char*>(batch.records_.data() + stored.at),
         stored.floats * sizeof(float)}};
    const rocksdb::Slice key_slice(key);
    rows.Put(rocksdb::SliceParts(&key_slice, 1), rocksdb::SliceParts(parts, 3));
  }
  rocksdb::Status s = db_->db->Write(rocksdb::WriteOptions(), &rows);
  if (!s.ok()) {
    write_failed_ = true;
    const bool full = s.IsNoSpace() || s.subcode() == rocksdb::Status::kNoSpace;
    const std::string message =
        absl::StrCat(options_.name, ": cannot write ", batch.puts(), " row(s) to its disk tier in ",
                     options_.dir, ": ", s.ToString(),
                     full ? "; free space there or give the table more memory_bytes"
                          : "; check the directory's device");
    return full ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
  }
  write_failed_ = false;
  size_ +=
      static_cast<int64_t>(batch.puts() - batch.replaces()) - static_cast<int64_t>(batch.deletes());
  return absl::OkStatus();
}

namespace {

absl::Status Iterate(rocksdb::DB* db, const rocksdb::Snapshot* snapshot, size_t record_floats,
                     const std::string& name, DiskRows::Visit visit) {
  rocksdb::ReadOptions read;
  read.snapshot = snapshot;
  // A full scan: keep the cache for the rows training reads.
  read.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(read));
  DiskRow row;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!ParseValue(it->value(), record_floats, &row)) {
      return absl::InternalError(absl::StrCat(name, ": row ", IdOf(it->key()),
                                              " in its disk tier is not a row of this table"));
    }
    visit(IdOf(it->key()), row);
  }
  if (!it->status().ok()) {
    return absl::InternalError(
        absl::StrCat(name, ": cannot read its disk tier: ", it->status().ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DiskRows::ForEach(Visit visit) const {
  return Iterate(db_->db, nullptr, options_.record_floats, options_.name, visit);
}

DiskRows::Snapshot DiskRows::TakeSnapshot() const {
  return Snapshot(db_, db_->db->GetSnapshot(), size_);
}

DiskRows::Snapshot::~Snapshot() {
  // A moved-from snapshot holds nothing.
  if (db_ != nullptr) db_->db->ReleaseSnapshot(static_cast<const rocksdb::Snapshot*>(snapshot_));
}

absl::StatusOr<bool> DiskRows::Snapshot::Get(uint64_t id, DiskRow* row) const {
  rocksdb::ReadOptions read;
  read.snapshot = static_cast<const rocksdb::Snapshot*>(snapshot_);
  rocksdb::PinnableSlice value;
  rocksdb::Status s = db_->db->Get(read, db_->db->DefaultColumnFamily(), Key(id), &value);
  if (s.IsNotFound()) return false;
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat(db_->name, ": cannot read row ", id, " from its disk tier: ", s.ToString()));
  }
  if (!ParseValue(value, db_->record_floats, row)) {
    return absl::InternalError(
        absl::StrCat(db_->name, ": row ", id, " in its disk tier is not a row of this table"));
  }
  return true;
}

absl::Status DiskRows::Snapshot::ForEach(Visit visit) const {
  return Iterate(db_->db, static_cast<const rocksdb::Snapshot*>(snapshot_), db_->record_floats,
                 db_->name, visit);
}

}  // namespace pst
