// The disk tier of one embedding table on one shard: the rows that do not
// fit in RAM, each with its optimizer state, update count and recency, in
// a RocksDB database of its own (no second storage engine of ours).
//
// A row is a fixed-layout value keyed by its id: the update count and the
// tick it was last touched at (int64 each), then its record (values, then
// optimizer slots), every number little-endian and bit exact, so a row
// that goes to disk and back is the row it was. The tier is a cache of the
// table, not its checkpoint: Open empties the directory a previous
// process left, and checkpoints read the rows through a Snapshot. The tier
// holds its directory (FileLock) while it lives, so a second process
// given the same folder is refused rather than emptying a live tier.
//
// Reads of ids the tier never stored. Most reads of a tiered table's cold
// rows are of new ids; an IdFilter of every id the tier was given answers
// nearly all of those without RocksDB (whose answer probes the Bloom
// filter of each of its files first), and reads_filtered() counts them.
//
// Counting. size() is exact without asking RocksDB, because the owner
// says what it writes: a Put of an id the tier does not hold, a Replace of
// one it holds, a Delete of one it holds. (A tiered table keeps a promoted
// row's disk copy until the row goes down again, which then Replaces it:
// one write a move instead of two.)
//
// Errors. Write is atomic (one RocksDB WriteBatch): on failure nothing of
// the batch is stored, and the status (RESOURCE_EXHAUSTED for a full disk,
// INTERNAL otherwise) names the table, the shard and the directory. A
// later Write first tries to bring the database back (RocksDB stops
// writing after an I/O error until it is resumed); reads go on meanwhile.
//
// Thread-safety: the owner serializes Write and the counters; Get and a
// Snapshot's ForEach may run on any thread (RocksDB's reads are
// thread-safe), which is what a prefetch of the next step's rows or a
// checkpoint written outside the shard's lock needs.
#ifndef PST_PS_SERVER_CORE_DISK_ROWS_H_
#define PST_PS_SERVER_CORE_DISK_ROWS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps_server/core/id_filter.h"

namespace pst {

struct DiskRowsOptions {
  // The database's directory, created (and emptied) by Open.
  std::string dir;
  // Floats per row record: values and optimizer slots.
  size_t record_floats = 0;
  // What the errors name, e.g. "embedding table \"t\" shard 0".
  std::string name;
  // For tests: while *fail_writes is true, every file write of the
  // database fails as on a full disk.
  std::shared_ptr<std::atomic<bool>> fail_writes;
};

// One row as the disk tier holds it.
struct DiskRow {
  int64_t updates = 0;
  int64_t touched = 0;
  std::vector<float> record;
};

class DiskRows {
  struct Db;

 public:
  // Creates options.dir, takes hold of it, removes whatever it holds, and
  // opens an empty database there. FailedPrecondition where another tier
  // (in this process or another) holds the directory; INTERNAL naming the
  // directory if anything else fails.
  static absl::StatusOr<std::unique_ptr<DiskRows>> Open(DiskRowsOptions options);
  ~DiskRows();
  DiskRows(const DiskRows&) = delete;
  DiskRows& operator=(const DiskRows&) = delete;

  const std::string& dir() const { return options_.dir; }
  size_t record_floats() const { return options_.record_floats; }
  // Rows held.
  int64_t size() const { return size_; }
  // Bytes the database takes: its SST files and memtables.
  int64_t bytes() const;
  // False only for an id the tier does not hold (true for some others).
  bool MayHold(uint64_t id) const { return stored_ids_.MayHold(id); }
  // Reads (Get, GetSorted's ids) that the id filter answered "not held".
  int64_t reads_filtered() const { return reads_filtered_.load(std::memory_order_relaxed); }
  // Bytes of RAM the id filter takes.
  int64_t filter_bytes() const { return stored_ids_.bytes(); }

  // `id`'s row into *row (record resized to record_floats); false when the
  // tier does not hold it. INTERNAL for a read error or a malformed value.
  absl::StatusOr<bool> Get(uint64_t id, DiskRow* row) const;

  // The rows of `ids`, in increasing order, at once (RocksDB's batched
  // MultiGet): rows[i] and found[i] as Get's for ids[i]. INTERNAL for the
  // first read error or malformed value; the rows are then unspecified.
  absl::Status GetSorted(std::span<const uint64_t> ids, std::span<DiskRow> rows,
                         std::span<bool> found) const;

  // Rows to write at once. A row's contents are copied in, side by side
  // with the others', and go to RocksDB as slices of that copy: no string
  // a row, no allocation a row.
  class Batch {
   public:
    // Stores `id`'s row, which the tier does not hold.
    void Put(uint64_t id, std::span<const float> record, int64_t updates, int64_t touched);
    // Stores `id`'s row over the one the tier holds.
    void Replace(uint64_t id, std::span<const float> record, int64_t updates, int64_t touched);
    // Drops `id`'s row, which the tier holds.
    void Delete(uint64_t id);
    bool empty() const { return ids_.empty(); }
    size_t puts() const { return puts_.size(); }
    size_t deletes() const { return ids_.size() - puts_.size(); }
    // Of puts(), those that Replace a row.
    size_t replaces() const { return replaces_; }
    // Every id the batch stores or drops.
    std::span<const uint64_t> ids() const { return ids_; }

   private:
    friend class DiskRows;
    struct Stored {
      int64_t updates;
      int64_t touched;
      size_t at;  // of the record in records_
      size_t floats;
    };
    std::vector<uint64_t> ids_;
    // Per id of ids_: its Stored's index in puts_, or -1 for a drop.
    std::vector<int64_t> put_of_;
    std::vector<Stored> puts_;
    std::vector<float> records_;
    size_t replaces_ = 0;
  };
  // Applies `batch` all at once, or nothing of it (see Errors above).
  absl::Status Write(const Batch& batch);

  using Visit = absl::FunctionRef<void(uint64_t id, const DiskRow& row)>;
  // Every row held now, in id order. INTERNAL for a read error.
  absl::Status ForEach(Visit visit) const;

  // The rows as they were when taken (a RocksDB snapshot), readable later
  // on any thread; it keeps the database open while it lives, and releases
  // the snapshot when destroyed.
  class Snapshot {
   public:
    Snapshot(Snapshot&&) = default;
    Snapshot& operator=(Snapshot&&) = delete;
    ~Snapshot();
    int64_t size() const { return size_; }
    absl::Status ForEach(Visit visit) const;
    // `id`'s row as it was when taken, as DiskRows::Get (a delta
    // checkpoint reads the rows it names this way).
    absl::StatusOr<bool> Get(uint64_t id, DiskRow* row) const;

   private:
    friend class DiskRows;
    Snapshot(std::shared_ptr<Db> db, const void* snapshot, int64_t size)
        : db_(std::move(db)), snapshot_(snapshot), size_(size) {}
    std::shared_ptr<Db> db_;
    const void* snapshot_;  // a const rocksdb::Snapshot*
    int64_t size_;
  };
  Snapshot TakeSnapshot() const;

 private:
  DiskRows(DiskRowsOptions options, std::shared_ptr<Db> db);

  const DiskRowsOptions options_;
  const std::shared_ptr<Db> db_;
  int64_t size_ = 0;
  // Every id a Write stored, set before RocksDB holds its row.
  IdFilter stored_ids_;
  mutable std::atomic<int64_t> reads_filtered_{0};
  // A write failed: the database may need resuming before the next.
  bool write_failed_ = false;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_DISK_ROWS_H_
