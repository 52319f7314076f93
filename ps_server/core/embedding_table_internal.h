// What EmbeddingTable's sources share: embedding_table.cc (updates and
// the SYNC step), embedding_pulls.cc (pulls), embedding_tiers.cc (the disk
// tier), embedding_checkpoint.cc (Export and Restore) and
// embedding_changes.cc (the changes for backups).
// Not for use outside them.
#ifndef PST_PS_SERVER_CORE_EMBEDDING_TABLE_INTERNAL_H_
#define PST_PS_SERVER_CORE_EMBEDDING_TABLE_INTERNAL_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ps_server/core/disk_rows.h"
#include "ps_server/core/embedding_init.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/id_set.h"
#include "ps_server/core/row_prefetch.h"

namespace pst {

// One table: its resolved spec and rule, its rows, and the rows an update
// has staged but not committed.
struct EmbeddingTable::Embedding {
  Embedding(EmbeddingTableConfig spec, std::unique_ptr<Optimizer> rule, uint64_t seed)
      : config(std::move(spec)),
        optimizer(std::move(rule)),
        seed(seed),
        init(seed, config),
        rows(config.dim(), optimizer->SlotsPerParameter()),
        row_limit(RowLimit(config, record_floats())) {}

  int dim() const { return config.dim(); }
  size_t slot_floats() const {
    return static_cast<size_t>(optimizer->SlotsPerParameter()) * config.dim();
  }
  size_t record_floats() const { return config.dim() + slot_floats(); }
  bool tiered() const { return disk != nullptr; }
  // Whether a new row goes to disk, not RAM, once RAM is full: under LFU
  // with a disk tier, where a new row (one update) is the least frequent
  // of all. It comes into RAM when an update reads it again.
  bool new_rows_to_disk() const {
    return tiered() && config.storage().hot_set() == TableStorage::LEAST_FREQUENTLY_USED;
  }
  // Whether the spec names a disk tier (open or not yet).
  bool tiered_spec() const { return !config.storage().disk().empty(); }
  int64_t ttl() const { return config.storage().ttl_steps(); }
  // Whether row `a` should leave RAM before row `b` (TableStorage.hot_set):
  // the less recently updated, or the less often updated, then the less
  // recently.
  bool Colder(int64_t a, int64_t b) const {
    if (config.storage().hot_set() == TableStorage::LEAST_FREQUENTLY_USED &&
        rows.updates(a) != rows.updates(b)) {
      return rows.updates(a) < rows.updates(b);
    }
    return rows.touched(a) < rows.touched(b);
  }

  // Bytes one row takes in RAM: its record (values, slots, update count
  // and tick), its id in its block, and its index entry (an id, a row
  // number and a control byte) at the index's lowest load after growing
  // (about half full), so a table never outgrows its budget by more than
  // a block of rows.
  static int64_t RowBytes(size_t record_floats) {
    constexpr int64_t kIndexEntry = sizeof(uint64_t) + sizeof(uint32_t) + 1;
    return static_cast<int64_t>(record_floats * sizeof(float)) + 2 * int64_t{sizeof(int64_t)} +
           int64_t{sizeof(uint64_t)} + 2 * kIndexEntry;
  }
  // The rows RAM holds: max_rows_per_shard, or fewer under memory_bytes
  // (at least 1).
  static int64_t RowLimit(const EmbeddingTableConfig& config, size_t record_floats) {
    const int64_t budget = config.storage().memory_bytes();
    if (budget <= 0) return config.max_rows_per_shard();
    return std::clamp<int64_t>(budget / RowBytes(record_floats), 1, config.max_rows_per_shard());
  }

  const EmbeddingTableConfig config;
  const std::unique_ptr<Optimizer> optimizer;
  const uint64_t seed;
  // The table's initial rows; its key seeds the table's eviction draws.
  const TableInit init;
  RowStore rows;
  const int64_t row_limit;
  // The disk tier (storage.disk), or null: then a row past the limit is
  // evicted or refused.
  std::unique_ptr<DiskRows> disk;
  // Reads the disk tier ahead of the calls that need its rows (with disk;
  // declared after it, so that it stops first).
  std::unique_ptr<RowPrefetch> prefetch;
  // Writes `batch` to the disk tier, first forgetting what was read ahead
  // of its ids (row_prefetch.h, Freshness).
  absl::Status WriteDisk(const DiskRows::Batch& batch) {
    if (prefetch != nullptr) prefetch->Forget(batch.ids());
    return disk->Write(batch);
  }
  // Rows in RAM whose disk copy the tier still holds (RowStore::has_copy:
  // promoted, not gone down again); the tier's rows are disk->size() -
  // disk_copies.
  int64_t disk_copies = 0;
  int64_t rows_on_disk() const { return disk != nullptr ? disk->size() - disk_copies : 0; }
  int64_t updates = 0;
  int64_t rows_admitted = 0;
  int64_t rows_refused = 0;
  int64_t rows_evicted = 0;
  int64_t rows_demoted = 0;
  int64_t rows_promoted = 0;
  int64_t rows_expired = 0;
  // Row reads; pulls count too, under the shard's lock as every call.
  mutable int64_t lookups_in_memory = 0;
  mutable int64_t disk_reads = 0;
  mutable int64_t disk_read_hits = 0;
  // Of disk_reads, those the disk tier's id filter answered (ids it never
  // stored), those a read-ahead row answered in time, and those that
  // waited for the disk (read in the call, or read ahead but not yet
  // landed).
  mutable int64_t disk_reads_filtered = 0;
  mutable int64_t prefetch_hits = 0;
  mutable int64_t disk_waits = 0;
  // Draws the rows an eviction looks at: a sequence fixed by the table and
  // the update (eviction_tick), so that SYNC runs stay bitwise
  // reproducible.
  uint64_t eviction_draws = 0;
  int64_t eviction_tick = -1;
  // Starts the draws of update `tick`, unless they are under way: an
  // update's evictions and demotions continue one sequence.
  void DrawForUpdate(int64_t tick) {
    if (eviction_tick == tick) return;
    eviction_tick = tick;
    eviction_draws = init.key() ^ (static_cast<uint64_t>(tick) * 0x9e3779b97f4a7c15ULL);
  }
  // A bit per RAM row, all clear between calls: the rows an update's
  // admission keeps or has chosen (EmbeddingTable::Admit).
  std::vector<uint64_t> admit_marks;

  // What changed since the last capture of a checkpoint chain (the
  // shard's checkpoints with full_every > 1), for the next delta: the ids
  // of rows committed (trained or created) and of rows removed (expired,
  // evicted). Kept only while `track_changes`, which the first capture of
  // a chain sets; a capture swaps the sets out whole. Moving a row
  // between the tiers changes none of its contents, so it is not noted.
  bool track_changes = false;
  IdSet changed_ids;
  IdSet removed_ids;
  // The same, since the last update a primary forwarded to its backups
  // (ExportChanges), kept while `forward_changes` (the shard has backups):
  // the ids removed, and the rows the update wrote, in the update's
  // columns, copied where they are written (a row updated in place as it
  // is staged, a new one as it is added), while in cache: read back at the
  // export, every row would be an index lookup and a cache miss in a large
  // table. Rows staged past `committed_rows` go when the update is
  // discarded. A version commits once and is forwarded before anything
  // else changes the table; were a staging or a removal to follow a
  // commit before the export, the copies could hold a row twice or one
  // since removed: `irregular` notes it, and the export refuses.
  bool forward_changes = false;
  IdSet forward_removed;
  struct ForwardedRows {
    std::vector<uint64_t> ids;
    std::vector<int64_t> updates;
    std::vector<float> values;
    std::vector<float> slots;
    size_t committed_rows = 0;
    bool committed = false;
    bool irregular = false;
  } forwarded;
  void NoteChanged(uint64_t id) {
    if (track_changes) {
      changed_ids.insert(id);
      removed_ids.erase(id);
    }
    if (forward_changes) forward_removed.erase(id);
  }
  // A row an update writes: `record` its values, then its slots.
  void ForwardRow(uint64_t id, int64_t row_updates, const float* record) {
    if (!forward_changes) return;
    if (forwarded.committed) forwarded.irregular = true;
    forwarded.ids.push_back(id);
    forwarded.updates.push_back(row_updates);
    forwarded.values.insert(forwarded.values.end(), record, record + dim());
    forwarded.slots.insert(forwarded.slots.end(), record + dim(), record + record_floats());
  }
  void ForwardCommitted() {
    forwarded.committed_rows = forwarded.ids.size();
    forwarded.committed = forward_changes;
  }
  void ForwardNoneStaged() {
    const size_t n = forwarded.committed_rows;
    forwarded.ids.resize(n);
    forwarded.updates.resize(n);
    forwarded.values.resize(n * dim());
    forwarded.slots.resize(n * slot_floats());
  }
  void NoteRemoved(uint64_t id) {
    if (track_changes) {
      removed_ids.insert(id);
      changed_ids.erase(id);
    }
    if (forward_changes) {
      if (forwarded.committed) forwarded.irregular = true;
      forward_removed.insert(id);
    }
  }
  void ForgetForwarded() {
    forward_removed = {};
    forwarded.ids.clear();
    forwarded.updates.clear();
    forwarded.values.clear();
    forwarded.slots.clear();
    forwarded.committed_rows = 0;
    forwarded.committed = false;
    forwarded.irregular = false;
  }

  // The staged update: per staged id, its row (-1: a new one) and the
  // row's update count once committed. A row RAM holds is updated in
  // place (RowStore::BeginUpdate), its record as it was kept in
  // undo_records (saved_floats() each, for the ids of undo_ids) until
  // Commit drops it or Discard puts it back; a new row's values and state
  // wait in staged_records (record_floats() each, in order) for Commit to
  // add it.
  bool staged = false;
  std::vector<uint64_t> staged_ids;
  std::vector<int64_t> staged_rows;
  std::vector<int64_t> staged_updates;
  std::vector<float> staged_records;
  std::vector<uint64_t> undo_ids;
  std::vector<float> undo_records;
  int64_t staged_new = 0;
  int64_t staged_refused = 0;
};

namespace embedding_internal {

inline absl::Status Invalid(absl::string_view table, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("embedding table \"", table, "\": ", problem));
}

inline int64_t IdCount(const std::string& ids) {
  return static_cast<int64_t>(ids.size() / sizeof(uint64_t));
}

inline absl::Status CheckIdBytes(const EmbeddingRows& rows) {
  if (rows.ids().size() % sizeof(uint64_t) != 0) {
    return Invalid(rows.table(), absl::StrCat("ids take ", rows.ids().size(),
                                              " bytes, not a multiple of 8 (uint64 each)"));
  }
  return absl::OkStatus();
}

// splitmix64: a cheap, well-mixed sequence from a counter (the draws of
// the sampled LRU).
inline uint64_t NextDraw(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Sampled eviction looks for the coldest of a round of kEvictionSamples
// rows drawn at random, for up to kEvictionRounds rounds.
inline constexpr int kEvictionSamples = 8;
inline constexpr int kEvictionRounds = 4;

// One round's rows, drawn from [0, size), their counts hinted together:
// in a large table each is a cache miss, which comparing them one after
// the other paid in turn.
inline std::array<int64_t, kEvictionSamples> DrawRound(uint64_t* draws, int64_t size,
                                                       const RowStore& rows) {
  std::array<int64_t, kEvictionSamples> drawn;
  for (int64_t& row : drawn) {
    row = static_cast<int64_t>(NextDraw(draws) % static_cast<uint64_t>(size));
    rows.PrefetchCounts(row);
  }
  return drawn;
}

}  // namespace embedding_internal
}  // namespace pst

#endif  // PST_PS_SERVER_CORE_EMBEDDING_TABLE_INTERNAL_H_
