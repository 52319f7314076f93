// EmbeddingTable's checkpoint: every table's spec, counters and rows out
// (whole, or a chain's delta), and back in only once all of it has been
// checked. What a primary forwards to its backups: embedding_changes.cc.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/embedding_config.h"
#include "common/status_macros.h"
#include "ps_server/core/embedding_checkpoint_parts.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/embedding_table_internal.h"
#include "ps_server/core/row_step.h"
#include "ps_server/core/variable_store.h"
#include "spdlog/spdlog.h"

namespace pst {

namespace embedding_internal {

// The table's part of `checkpoint`, with its header written in.
ShardCheckpoint::Embedding* AddTable(const TableHeader& header, ShardCheckpoint* checkpoint) {
  ShardCheckpoint::Embedding* out = checkpoint->add_embeddings();
  *out->mutable_config() = header.config;
  out->set_seed(header.seed);
  out->set_num_shards(header.num_shards);
  out->set_updates(header.updates);
  out->set_rows_admitted(header.rows_admitted);
  out->set_rows_refused(header.rows_refused);
  out->set_rows_evicted(header.rows_evicted);
  out->set_rows_demoted(header.rows_demoted);
  out->set_rows_promoted(header.rows_promoted);
  out->set_rows_expired(header.rows_expired);
  return out;
}

int64_t RowOfCheckpoint(const ShardCheckpoint::Embedding& in, int64_t row, size_t dim, size_t slots,
                        float* record) {
  int64_t updates;
  std::memcpy(&updates, in.row_updates().data() + row * sizeof(int64_t), sizeof(updates));
  std::memcpy(record, in.values().data() + row * dim * sizeof(float), dim * sizeof(float));
  if (slots > 0) {
    std::memcpy(record + dim, in.slots().data() + row * slots * sizeof(float),
                slots * sizeof(float));
  }
  return updates;
}

DeltaPart::DeltaPart(const TableHeader& header, const std::vector<uint64_t>& removed, size_t rows,
                     ShardCheckpoint* checkpoint)
    : dim_(header.config.dim()), slots_(header.slot_floats), out_(AddTable(header, checkpoint)) {
  out_->mutable_removed_ids()->assign(reinterpret_cast<const char*>(removed.data()),
                                      removed.size() * sizeof(uint64_t));
  out_->mutable_ids()->reserve(rows * sizeof(uint64_t));
  out_->mutable_values()->reserve(rows * dim_ * sizeof(float));
  out_->mutable_slots()->reserve(rows * slots_ * sizeof(float));
  out_->mutable_row_updates()->reserve(rows * sizeof(int64_t));
}

void DeltaPart::Append(uint64_t id, int64_t updates, const float* values, const float* slots) {
  out_->mutable_ids()->append(reinterpret_cast<const char*>(&id), sizeof(id));
  out_->mutable_row_updates()->append(reinterpret_cast<const char*>(&updates), sizeof(updates));
  out_->mutable_values()->append(reinterpret_cast<const char*>(values), dim_ * sizeof(float));
  out_->mutable_slots()->append(reinterpret_cast<const char*>(slots), slots_ * sizeof(float));
}

void DeltaPart::AssignRows(std::span<const uint64_t> ids, std::span<const int64_t> updates,
                           std::span<const float> values, std::span<const float> slots) {
  auto assign = [](auto column, std::string* out) {
    out->assign(reinterpret_cast<const char*>(column.data()), column.size_bytes());
  };
  assign(ids, out_->mutable_ids());
  assign(updates, out_->mutable_row_updates());
  assign(values, out_->mutable_values());
  assign(slots, out_->mutable_slots());
}

}  // namespace embedding_internal

using embedding_internal::AddTable;
using embedding_internal::DeltaPart;
using embedding_internal::HeaderOf;
using embedding_internal::IdCount;
using embedding_internal::Invalid;
using embedding_internal::kRowsAhead;
using embedding_internal::RowOfCheckpoint;
using embedding_internal::TableHeader;

namespace {

// Marks `checkpoint` as not holding the whole table (`why`), so that no
// one writes or restores it as if it did.
void MarkIncomplete(const TableHeader& header, const absl::Status& why,
                    ShardCheckpoint* checkpoint) {
  const std::string message =
      absl::StrCat("embedding table \"", header.config.name(),
                   "\": the rows of its disk tier cannot be read: ", why.message());
  spdlog::error("{}", message);
  checkpoint->set_incomplete(message);
}

// The table's rows in RAM (`rows`), then those of its disk tier (`disk`, a
// DiskRows or a snapshot of one; null without a tier) but the disk copies
// of rows in RAM.
template <typename Rows, typename Disk>
void WriteTable(const TableHeader& header, const Rows& rows, const Disk* disk,
                ShardCheckpoint* checkpoint) {
  const int64_t in_memory = rows.size();
  const int64_t n = in_memory + (disk != nullptr ? disk->size() - header.disk_copies : 0);
  const size_t dim = header.config.dim();
  const size_t slots = header.slot_floats;
  ShardCheckpoint::Embedding* out = AddTable(header, checkpoint);
  std::string* ids = out->mutable_ids();
  std::string* values = out->mutable_values();
  std::string* state = out->mutable_slots();
  std::string* updates = out->mutable_row_updates();
  ids->resize(n * sizeof(uint64_t));
  values->resize(n * dim * sizeof(float));
  state->resize(n * slots * sizeof(float));
  updates->resize(n * sizeof(int64_t));
  auto write = [&](int64_t row, uint64_t id, int64_t row_updates, const float* row_values,
                   const float* row_slots) {
    std::memcpy(ids->data() + row * sizeof(uint64_t), &id, sizeof(id));
    std::memcpy(updates->data() + row * sizeof(int64_t), &row_updates, sizeof(row_updates));
    std::memcpy(values->data() + row * dim * sizeof(float), row_values, dim * sizeof(float));
    if (slots > 0) {
      std::memcpy(state->data() + row * slots * sizeof(float), row_slots, slots * sizeof(float));
    }
  };
  for (int64_t row = 0; row < in_memory; ++row) {
    write(row, rows.id(row), rows.updates(row), rows.values(row).data(), rows.slots(row).data());
  }
  if (disk == nullptr) return;
  absl::flat_hash_set<uint64_t> copies;
  copies.reserve(header.disk_copies);
  for (int64_t row = 0; row < in_memory && header.disk_copies > 0; ++row) {
    if (rows.has_copy(row)) copies.insert(rows.id(row));
  }
  int64_t row = in_memory;
  absl::Status read = disk->ForEach([&](uint64_t id, const DiskRow& cold) {
    if (copies.contains(id)) return;
    if (row < n) write(row, id, cold.updates, cold.record.data(), cold.record.data() + dim);
    ++row;
  });
  if (read.ok() && row != n) {
    read = absl::InternalError(absl::StrCat("its disk tier holds ", row - in_memory,
                                            " rows, not the ", n - in_memory, " counted"));
  }
  if (!read.ok()) MarkIncomplete(header, read, checkpoint);
}

// A checkpoint chain's delta of the table: its header, the ids in
// `removed`, and the rows of the ids in `changed`, which are each in the
// frozen RAM rows or else in the disk snapshot (both taken with the sets).
// RAM's are found among the rows whose places were written under change
// mark `mark` (RowStore::ForEachMarked), which the capture ended with the
// sets: a frozen view has no index, and scanning every row for the changed
// ones took a delta of 10^5 of 10^7 rows 0.18 s.
void WriteDelta(const TableHeader& header, const RowStore::Frozen& rows, int64_t mark,
                const DiskRows::Snapshot* disk, IdSet changed, const IdSet& removed,
                ShardCheckpoint* checkpoint) {
  const size_t dim = header.config.dim();
  DeltaPart part(header, removed.Sorted(), changed.size(), checkpoint);
  // The rows marked are taken a batch at a time, and each of their reads
  // (the id, its place in the set, the row found) hinted a few ahead, so
  // that their cache misses overlap.
  constexpr size_t kBatch = 256;
  constexpr size_t kAhead = 8;
  std::vector<int64_t> marked, found;
  std::vector<uint64_t> ids(kBatch);
  marked.reserve(kBatch);
  found.reserve(kBatch);
  auto take_batch = [&] {
    const size_t n = marked.size();
    for (size_t i = 0; i < std::min(n, kAhead); ++i) rows.PrefetchId(marked[i]);
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) rows.PrefetchId(marked[i + kAhead]);
      ids[i] = rows.id(marked[i]);
      changed.Prefetch(ids[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      if (changed.erase(ids[i])) found.push_back(marked[i]);
    }
    for (size_t i = 0; i < std::min(found.size(), kAhead); ++i) rows.PrefetchRow(found[i]);
    for (size_t i = 0; i < found.size(); ++i) {
      if (i + kAhead < found.size()) rows.PrefetchRow(found[i + kAhead]);
      const int64_t row = found[i];
      part.Append(rows.id(row), rows.updates(row), rows.values(row).data(), rows.slots(row).data());
    }
    marked.clear();
    found.clear();
  };
  rows.ForEachMarked(mark, [&](int64_t row) {
    marked.push_back(row);
    if (marked.size() == kBatch) take_batch();
  });
  take_batch();
  const std::vector<uint64_t> cold = changed.Sorted();  // RocksDB reads in key order
  DiskRow row;
  for (uint64_t id : cold) {
    absl::StatusOr<bool> found =
        disk != nullptr ? disk->Get(id, &row)
                        : absl::StatusOr<bool>(absl::InternalError("the table has no disk tier"));
    if (found.ok() && !*found) {
      found = absl::InternalError(absl::StrCat("row ", id, " changed, and is in neither tier"));
    }
    if (!found.ok()) {
      MarkIncomplete(header, found.status(), checkpoint);
      return;
    }
    part.Append(id, row.updates, row.record.data(), row.record.data() + dim);
  }
}

}  // namespace

void EmbeddingTable::Export(ShardCheckpoint* checkpoint) const {
  for (const auto& t : tables_) {
    WriteTable(HeaderOf(*t, options_.num_shards), t->rows, t->disk.get(), checkpoint);
  }
}

void EmbeddingTable::Capture(ShardSnapshot* snapshot) {
  // Each table's header and a frozen view of its rows now; the rows are
  // copied out when the snapshot is finished, outside the shard's lock.
  // A tiered table's disk rows: a RocksDB snapshot taken with the frozen
  // RAM rows, so each row is in one of the two, or in both where RAM's is
  // the row and the disk's a stale copy (has_copy). A chain's capture
  // takes the sets of changed ids along (their memory is freed outside
  // the lock too) and starts them anew.
  struct Frozen {
    TableHeader header;
    RowStore::Frozen rows;
    std::optional<DiskRows::Snapshot> disk;
    // A chain's: the rows' change mark the capture ended, and the ids
    // changed and removed under it.
    int64_t mark = -1;
    IdSet changed;
    IdSet removed;
  };
  const CaptureKind kind = snapshot->kind;
  std::vector<Frozen> frozen;
  frozen.reserve(tables_.size());
  for (const auto& t : tables_) {
    frozen.push_back(
        {.header = HeaderOf(*t, options_.num_shards),
         .rows = t->rows.Freeze(),
         .disk = t->tiered() ? std::optional(t->disk->TakeSnapshot()) : std::nullopt,
         .changed = {},
         .removed = {}});
    if (kind == CaptureKind::kWhole) continue;
    frozen.back().mark = t->rows.EndChanges();
    frozen.back().changed = std::exchange(t->changed_ids, {});
    frozen.back().removed = std::exchange(t->removed_ids, {});
    t->track_changes = true;
  }
  snapshot->later.push_back(
      [kind, frozen = std::move(frozen)](ShardCheckpoint* checkpoint) mutable {
        for (Frozen& table : frozen) {
          const DiskRows::Snapshot* disk = table.disk ? &*table.disk : nullptr;
          if (kind == CaptureKind::kChainDelta) {
            WriteDelta(table.header, table.rows, table.mark, disk, std::move(table.changed),
                       table.removed, checkpoint);
          } else {
            WriteTable(table.header, table.rows, disk, checkpoint);
          }
        }
      });
}

bool EmbeddingTable::TracksChanges() const {
  // Without tables a delta would be a full checkpoint by another name.
  return !tables_.empty() && std::all_of(tables_.begin(), tables_.end(),
                                         [](const auto& t) { return t->track_changes; });
}

absl::Status EmbeddingTable::SpillRestored(Embedding& table,
                                           const ShardCheckpoint::Embedding& in) {
  // Batches bound the memory a write takes; the rows were checked.
  constexpr int64_t kBatchRows = 4096;
  const int64_t n = IdCount(in.ids());
  const size_t dim = table.dim();
  const size_t slot_floats = table.slot_floats();
  std::vector<float> record(table.record_floats());
  DiskRows::Batch batch;
  for (int64_t row = table.row_limit; row < n; ++row) {
    const int64_t row_updates = RowOfCheckpoint(in, row, dim, slot_floats, record.data());
    // As RAM's restored rows: as recent as the checkpoint.
    batch.Put(RowId(in.ids(), row), record, row_updates, in.updates());
    if (static_cast<int64_t>(batch.puts()) == kBatchRows) {
      PST_RETURN_IF_ERROR(table.WriteDisk(batch));
      batch = DiskRows::Batch();
    }
  }
  return table.WriteDisk(batch);
}

absl::Status EmbeddingTable::Restore(const ShardCheckpoint& checkpoint) {
  if (!checkpoint.incomplete().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint is incomplete: ", checkpoint.incomplete()));
  }
  std::vector<std::unique_ptr<Embedding>> tables;
  std::map<std::string, int, std::less<>> names;
  std::vector<float> values, slots;
  for (const ShardCheckpoint::Embedding& in : checkpoint.embeddings()) {
    absl::flat_hash_set<uint64_t> spilled;
    const std::string& name = in.config().name();
    auto inconsistent = [&name](absl::string_view problem) {
      return Invalid(name, absl::StrCat("the checkpoint is inconsistent: ", problem));
    };
    if (in.num_shards() != options_.num_shards) {
      return Invalid(
          name, absl::StrCat("the checkpoint's rows were placed over ", in.num_shards(),
                             " shards, this job has ", options_.num_shards,
                             "; rows are placed by a hash of the id modulo the shard count, ",
                             "so restore onto ", in.num_shards(), " shards"));
    }
    PST_ASSIGN_OR_RETURN(EmbeddingTableConfig spec,
                         ResolveEmbeddingTable(in.config(), options_.optimizer));
    if (!names.emplace(name, static_cast<int>(tables.size())).second) {
      return inconsistent("the table appears twice");
    }
    std::unique_ptr<Optimizer> rule = *MakeOptimizer(spec.optimizer());
    auto table = std::make_unique<Embedding>(std::move(spec), std::move(rule), in.seed());
    const int64_t n = IdCount(in.ids());
    const size_t dim = table->dim();
    const size_t slot_floats = table->slot_floats();
    if (in.ids().size() != n * sizeof(uint64_t) || in.values().size() != n * dim * sizeof(float) ||
        in.slots().size() != n * slot_floats * sizeof(float) ||
        in.row_updates().size() != n * sizeof(int64_t)) {
      return inconsistent(absl::StrCat("the sizes of ids, values, slots and updates disagree for ",
                                       "dim ", dim, " and the ", table->optimizer->Name(),
                                       " optimizer"));
    }
    if ((!table->tiered_spec() && n > table->row_limit) || in.rows_admitted() < n ||
        in.rows_refused() < 0 || in.rows_evicted() < 0 || in.updates() < 0 ||
        in.rows_demoted() < 0 || in.rows_promoted() < 0 || in.rows_expired() < 0) {
      return inconsistent(absl::StrCat(n, " rows do not fit its limit or counters"));
    }
    values.resize(dim);
    slots.resize(slot_floats);
    // Restored rows are as recent as the checkpoint, not older than every
    // row trained after it.
    table->rows.set_tick(in.updates());
    for (int64_t row = 0; row < n; ++row) {
      const uint64_t id = RowId(in.ids(), row);
      int64_t row_updates;
      std::memcpy(&row_updates, in.row_updates().data() + row * sizeof(int64_t),
                  sizeof(row_updates));
      std::memcpy(values.data(), in.values().data() + row * dim * sizeof(float),
                  dim * sizeof(float));
      if (slot_floats > 0) {
        std::memcpy(slots.data(), in.slots().data() + row * slot_floats * sizeof(float),
                    slot_floats * sizeof(float));
      }
      PST_RETURN_IF_ERROR(CheckShard(*table, id, "the checkpoint's"));
      if (table->rows.Find(id) >= 0 || spilled.contains(id)) {
        return inconsistent(absl::StrCat("id ", id, " appears twice"));
      }
      // The shard never commits a non-finite value, so one here was not
      // written by a PS; a row with no update was seeded by an Init.
      if (!AllFinite(values) || !AllFinite(slots) || row_updates < 0) {
        return inconsistent(absl::StrCat("the row of id ", id,
                                         " holds a non-finite value or a negative update count"));
      }
      if (table->rows.size() < table->row_limit) {
        table->rows.Add(id, values, slots, row_updates);
      } else {
        spilled.insert(id);  // to disk, once all of the checkpoint is checked
      }
    }
    table->updates = in.updates();
    table->rows_admitted = in.rows_admitted();
    table->rows_refused = in.rows_refused();
    table->rows_evicted = in.rows_evicted();
    table->rows_demoted = in.rows_demoted();
    table->rows_promoted = in.rows_promoted();
    table->rows_expired = in.rows_expired();
    tables.push_back(std::move(table));
  }
  // Everything checked. The disk tiers open now, after the tables they
  // replace let go of their directories; a disk error from here on
  // leaves the shard without embedding tables (its Restore failed).
  Adopt({});
  initialized_ = false;
  for (size_t t = 0; t < tables.size(); ++t) {
    Embedding& table = *tables[t];
    if (!table.tiered_spec()) continue;
    PST_RETURN_IF_ERROR(OpenDisk(table));
    PST_RETURN_IF_ERROR(SpillRestored(table, checkpoint.embeddings(static_cast<int>(t))));
  }
  Adopt(std::move(tables));
  return absl::OkStatus();
}

}  // namespace pst
