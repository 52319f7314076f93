// EmbeddingTable's changes for its backups: a primary's updates since the
// last one it forwarded, in a delta checkpoint's form (ExportChanges), and
// a backup's check and application of them (CheckChanges, ApplyChanges).
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps_server/core/embedding_checkpoint_parts.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/embedding_table_internal.h"

namespace pst {

using embedding_internal::DeltaPart;
using embedding_internal::HeaderOf;
using embedding_internal::IdCount;
using embedding_internal::Invalid;
using embedding_internal::kRowsAhead;
using embedding_internal::RowOfCheckpoint;

absl::Status EmbeddingTable::ExportChanges(ShardCheckpoint* checkpoint) {
  for (const auto& t : tables_) {
    if (t->forwarded.irregular) {
      return absl::InternalError(absl::StrCat(
          "embedding table \"", t->config.name(),
          "\": an update was staged or a row removed after a commit whose changes were not yet "
          "forwarded"));
    }
  }
  for (const auto& t : tables_) {
    Embedding::ForwardedRows& rows = t->forwarded;
    DeltaPart part(HeaderOf(*t, options_.num_shards), t->forward_removed.Sorted(), 0, checkpoint);
    part.AssignRows(rows.ids, rows.updates, rows.values, rows.slots);
    t->ForgetForwarded();
  }
  return absl::OkStatus();
}

void EmbeddingTable::ForgetChanges(bool forward) {
  for (const auto& t : tables_) {
    t->ForgetForwarded();
    t->forward_changes = forward;
  }
}

absl::Status EmbeddingTable::CheckChanges(const ShardCheckpoint& delta) const {
  if (delta.embeddings_size() != static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("the update holds ", delta.embeddings_size(),
                                                   " embedding tables, this shard ",
                                                   tables_.size()));
  }
  for (int t = 0; t < delta.embeddings_size(); ++t) {
    const ShardCheckpoint::Embedding& in = delta.embeddings(t);
    // In the tables' order: ApplyChanges reads them so.
    if (in.config().name() != tables_[t]->config.name()) {
      return Invalid(in.config().name(), "the update names another table in this place");
    }
    const Embedding& table = *tables_[t];
    const int64_t n = IdCount(in.ids());
    const size_t dim = table.dim();
    const size_t slots = table.slot_floats();
    if (in.config().dim() != table.dim() || in.ids().size() != n * sizeof(uint64_t) ||
        in.values().size() != n * dim * sizeof(float) ||
        in.slots().size() != n * slots * sizeof(float) ||
        in.row_updates().size() != n * sizeof(int64_t) ||
        in.removed_ids().size() % sizeof(uint64_t) != 0) {
      return Invalid(in.config().name(), "the update's sizes disagree with the table's");
    }
    if (in.updates() < 0 || in.rows_admitted() < 0 || in.rows_refused() < 0 ||
        in.rows_evicted() < 0 || in.rows_expired() < 0) {
      return Invalid(in.config().name(), "the update holds a negative counter");
    }
    std::vector<float> record(dim + slots);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t id = RowId(in.ids(), i);
      PST_RETURN_IF_ERROR(CheckShard(table, id, "the update's"));
      const int64_t row_updates = RowOfCheckpoint(in, i, dim, slots, record.data());
      // The shard never commits a non-finite value: one here was not
      // written by a primary.
      if (!AllFinite(record) || row_updates < 0) {
        return Invalid(in.config().name(),
                       absl::StrCat("the update's row of id ", id,
                                    " holds a non-finite value or a negative update count"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::ApplyChanges(const ShardCheckpoint& delta) {
  std::vector<float> record;
  for (int t = 0; t < delta.embeddings_size(); ++t) {
    const ShardCheckpoint::Embedding& in = delta.embeddings(t);
    Embedding& table = *tables_[t];
    // A backup notes its changes for its own checkpoint chain only: what
    // it would forward starts anew when it becomes primary.
    table.forward_changes = false;
    const size_t dim = table.dim();
    const size_t slots = table.slot_floats();
    record.resize(dim + slots);
    DiskRows::Batch batch;
    DiskRow cold;
    auto on_disk = [&](uint64_t id) -> absl::StatusOr<bool> {
      if (!table.tiered()) return false;
      return table.disk->Get(id, &cold);
    };
    for (int64_t i = 0, n = IdCount(in.removed_ids()); i < n; ++i) {
      const uint64_t id = RowId(in.removed_ids(), i);
      const int64_t row = table.rows.Find(id);
      bool copy = false;
      if (row >= 0) {
        copy = table.rows.has_copy(row);
        if (copy) --table.disk_copies;
        table.rows.Remove(row);
      }
      table.NoteRemoved(id);
      if (!copy) {
        PST_ASSIGN_OR_RETURN(bool held, on_disk(id));
        copy = held;
      }
      if (copy) batch.Delete(id);
    }
    // As the primary marked them: updated at the table's update count.
    table.rows.set_tick(in.updates());
    // Found first and then written, hinted ahead, as StageRows finds and
    // writes an update's rows; after the removals, which move rows, and
    // before any Add, which moves none.
    const int64_t n = IdCount(in.ids());
    std::vector<uint64_t> ids(n);
    if (n > 0) std::memcpy(ids.data(), in.ids().data(), n * sizeof(uint64_t));
    std::vector<int64_t> found(n);
    table.rows.FindEach(ids, found);
    for (int64_t i = 0; i < n; ++i) {
      if (i + static_cast<int64_t>(kRowsAhead) < n && found[i + kRowsAhead] >= 0) {
        table.rows.PrefetchRow(found[i + kRowsAhead]);
      }
      const uint64_t id = ids[i];
      const int64_t row_updates = RowOfCheckpoint(in, i, dim, slots, record.data());
      const std::span<const float> values(record.data(), dim);
      const std::span<const float> state(record.data() + dim, slots);
      table.NoteChanged(id);
      if (const int64_t row = found[i]; row >= 0) {
        table.rows.Update(row, values, state, row_updates);
        continue;
      }
      PST_ASSIGN_OR_RETURN(bool held, on_disk(id));
      if (!held && table.rows.size() < table.row_limit) {
        table.rows.Add(id, values, state, row_updates);
        continue;
      }
      if (!table.tiered()) {
        // The primary made room by removing rows: these tables are not the
        // primary's.
        return absl::DataLossError(absl::StrCat("embedding table \"", table.config.name(),
                                                "\": row ", id, " does not fit the backup's ",
                                                table.row_limit, " rows"));
      }
      if (held) {
        batch.Replace(id, record, row_updates, in.updates());
      } else {
        batch.Put(id, record, row_updates, in.updates());
      }
    }
    if (!batch.empty()) PST_RETURN_IF_ERROR(table.WriteDisk(batch));
    table.updates = in.updates();
    table.rows_admitted = in.rows_admitted();
    table.rows_refused = in.rows_refused();
    table.rows_evicted = in.rows_evicted();
    table.rows_expired = in.rows_expired();
  }
  return absl::OkStatus();
}

}  // namespace pst
