// EmbeddingTable's tiers: the disk tier's opening, an update's admission
// (promotion and demotion), expiry, and reads of cold rows.
#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "placement/row_placement.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/embedding_table_internal.h"
#include "spdlog/spdlog.h"

namespace pst {

using embedding_internal::DrawRound;
using embedding_internal::IdCount;
using embedding_internal::kEvictionRounds;
using embedding_internal::NextDraw;

absl::Status EmbeddingTable::OpenDisk(Embedding& table) const {
  const std::string& disk = table.config.storage().disk();
  if (disk.empty()) return absl::OkStatus();
  const std::string name =
      absl::StrCat("embedding table \"", table.config.name(), "\" shard ", options_.shard);
  PST_ASSIGN_OR_RETURN(
      table.disk,
      DiskRows::Open(
          {.dir = (std::filesystem::path(disk) /
                   absl::StrCat(
                       table.config.name(), "-shard", options_.shard,
                       options_.replica > 0 ? absl::StrCat("-replica", options_.replica) : ""))
                      .string(),
           .record_floats = table.record_floats(),
           .name = name,
           .fail_writes = options_.disk_fail_writes}));
  if (options_.prefetch_rows > 0) {
    // Rows read ahead and never trained (an evaluation's pulls) go after
    // a few updates.
    constexpr int64_t kMaxAge = 4;
    table.prefetch =
        std::make_unique<RowPrefetch>(table.disk.get(), options_.prefetch_rows, kMaxAge);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> EmbeddingTable::ReadDisk(const Embedding& table, uint64_t id, bool take,
                                              DiskRow* row) const {
  ++table.disk_reads;
  // Most ids RAM misses are new: the tier's id filter says so without a
  // read (and Prefetch did not read them ahead).
  if (!table.disk->MayHold(id)) {
    ++table.disk_reads_filtered;
    return false;
  }
  bool found = false;
  RowPrefetch::Answer ahead;
  if (table.prefetch != nullptr) {
    ahead = take ? table.prefetch->Take(id, row) : table.prefetch->Read(id, row);
  }
  if (ahead.outcome == RowPrefetch::Outcome::kAbsent) {
    ++table.disk_waits;
    PST_ASSIGN_OR_RETURN(found, table.disk->Get(id, row));
  } else {
    ++(ahead.outcome == RowPrefetch::Outcome::kReady ? table.prefetch_hits : table.disk_waits);
    PST_RETURN_IF_ERROR(ahead.status);
    found = ahead.found;
  }
  if (found) ++table.disk_read_hits;
  return found;
}

absl::StatusOr<bool> EmbeddingTable::ReadCold(const Embedding& table, uint64_t id,
                                              std::span<float> out) const {
  PST_ASSIGN_OR_RETURN(bool found, ReadDisk(table, id, /*take=*/false, &cold_scratch_));
  if (found) std::copy_n(cold_scratch_.record.begin(), out.size(), out.begin());
  return found;
}

std::vector<uint64_t> EmbeddingTable::ColdIds(absl::string_view name,
                                              std::span<const uint64_t> ids) const {
  std::vector<uint64_t> cold;
  const int t = Find(name);
  if (t < 0 || !tables_[t]->tiered()) return cold;
  for (uint64_t id : ids) {
    if (tables_[t]->rows.Find(id) < 0) cold.push_back(id);
  }
  return cold;
}

bool EmbeddingTable::ReadsAhead() const {
  return std::any_of(tables_.begin(), tables_.end(),
                     [](const auto& table) { return table->prefetch != nullptr; });
}

void EmbeddingTable::Prefetch(const PullRequest& pull) const {
  std::vector<uint64_t> ours;
  std::vector<int64_t> found;
  std::vector<uint64_t> cold;
  for (const EmbeddingRows& rows : pull.rows()) {
    const int t = Find(rows.table());
    if (t < 0 || tables_[t]->prefetch == nullptr) continue;
    const Embedding& table = *tables_[t];
    ours.clear();
    for (int64_t i = 0; i < IdCount(rows.ids()); ++i) {
      const uint64_t id = RowId(rows.ids(), i);
      if (ShardOfRow(id, options_.num_shards) == options_.shard) ours.push_back(id);
    }
    found.resize(ours.size());
    table.rows.FindEach(ours, found);
    cold.clear();
    for (size_t i = 0; i < ours.size(); ++i) {
      if (found[i] < 0 && table.disk->MayHold(ours[i])) cold.push_back(ours[i]);
    }
    table.prefetch->Request(cold, table.updates);
  }
}

absl::Status EmbeddingTable::Admit(Embedding& table, std::span<const uint64_t> ids) {
  if (table.ttl() > 0) PST_RETURN_IF_ERROR(Expire(table));
  if (!table.tiered()) return absl::OkStatus();
  // The rows this update trains that RAM holds stay; of the others, those
  // on disk come up whole, the rest are new. Rows are marked in the
  // table's bitmap by row number, and their bits cleared again on the way
  // out (two hash sets built a call took about a fifteenth of a tiered
  // step's staging).
  const int64_t size = table.rows.size();
  std::vector<uint64_t>& marks = table.admit_marks;
  if (marks.size() * 64 < static_cast<size_t>(size)) marks.resize((size + 63) / 64);
  std::vector<int64_t> marked;
  absl::Cleanup unmark = [&] {
    for (const int64_t row : marked) marks[row >> 6] = 0;
  };
  auto is_marked = [&](int64_t row) { return (marks[row >> 6] >> (row & 63)) & 1; };
  int64_t trained = 0;
  auto mark = [&](int64_t row) {
    if (is_marked(row)) return false;
    marks[row >> 6] |= uint64_t{1} << (row & 63);
    marked.push_back(row);
    return true;
  };
  for (size_t i = 0; i < table.staged_ids.size(); ++i) {  // an earlier part of the update
    if (table.staged_rows[i] >= 0) trained += mark(table.staged_rows[i]);
  }
  std::vector<int64_t> found(ids.size());
  table.rows.FindEach(ids, found);
  std::vector<uint64_t> promoted_ids;
  std::vector<DiskRow> promoted;
  int64_t fresh = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t id = ids[i];
    if (const int64_t row = found[i]; row >= 0) {
      ++table.lookups_in_memory;
      trained += mark(row);
      continue;
    }
    DiskRow cold;
    PST_ASSIGN_OR_RETURN(bool found, ReadDisk(table, id, /*take=*/true, &cold));
    if (!found) {
      ++fresh;
      continue;
    }
    promoted_ids.push_back(id);
    promoted.push_back(std::move(cold));
  }
  // Room for every row coming into RAM (new ones included, which Commit
  // adds): as many untrained rows as RAM holds past the limit go down,
  // chosen as the eviction's (the coldest of a few drawn, by hot_set, with
  // draws fixed by the table and the update, so a run demotes the same
  // rows every time). When the update's own rows are more than the limit,
  // every other row goes and RAM holds the update's. A chosen row is
  // marked as the trained ones are: neither is drawn again.
  // Under LFU a new row takes only the room RAM has (Commit sends the rest
  // to disk): no row goes down for it.
  const int64_t incoming = static_cast<int64_t>(promoted.size()) +
                           (table.new_rows_to_disk() ? 0 : fresh + table.staged_new);
  const int64_t excess = std::min<int64_t>(size + incoming - table.row_limit, size - trained);
  std::vector<int64_t> victims;
  if (excess > 0) {
    const int64_t tick = table.updates + 1;
    table.DrawForUpdate(tick);
    while (static_cast<int64_t>(victims.size()) < excess) {
      int64_t victim = -1;
      for (int round = 0; round < kEvictionRounds && victim < 0; ++round) {
        for (const int64_t row : DrawRound(&table.eviction_draws, size, table.rows)) {
          if (!is_marked(row) && (victim < 0 || table.Colder(row, victim))) victim = row;
        }
      }
      // Draws that keep hitting trained or chosen rows (a table nearly all
      // trained by this update): the next eligible row from a drawn start.
      for (int64_t k = 0, start = static_cast<int64_t>(NextDraw(&table.eviction_draws) %
                                                      static_cast<uint64_t>(size));
           victim < 0 && k < size; ++k) {
        if (!is_marked((start + k) % size)) victim = (start + k) % size;
      }
      mark(victim);
      victims.push_back(victim);
    }
  }
  if (victims.empty() && promoted.empty()) return absl::OkStatus();
  // A promoted row's disk copy stays (it is replaced when the row goes
  // down again), so a move costs one write, the demotion's.
  DiskRows::Batch batch;
  std::vector<float> record(table.record_floats());
  int64_t replaced = 0;
  for (int64_t row : victims) {
    std::span<const float> values = table.rows.values(row);
    std::span<const float> slots = table.rows.slots(row);
    std::copy(values.begin(), values.end(), record.begin());
    std::copy(slots.begin(), slots.end(), record.begin() + table.dim());
    if (table.rows.has_copy(row)) {
      batch.Replace(table.rows.id(row), record, table.rows.updates(row), table.rows.touched(row));
      ++replaced;
    } else {
      batch.Put(table.rows.id(row), record, table.rows.updates(row), table.rows.touched(row));
    }
  }
  // One atomic write: if it fails, RAM and disk are as they were.
  PST_RETURN_IF_ERROR(table.WriteDisk(batch));
  table.disk_copies -= replaced;
  // Highest first: Remove moves the last row into the hole, and the last
  // row is then never a victim still to remove.
  std::sort(victims.begin(), victims.end(), std::greater<>());
  for (int64_t row : victims) table.rows.Remove(row);
  table.rows_demoted += static_cast<int64_t>(victims.size());
  // Rows an earlier part of the update staged may have moved.
  for (size_t i = 0; i < table.staged_ids.size(); ++i) {
    if (table.staged_rows[i] >= 0) table.staged_rows[i] = table.rows.Find(table.staged_ids[i]);
  }
  // A promoted row keeps its recency until the update trains it.
  const int64_t tick = table.rows.tick();
  const size_t dim = table.dim();
  for (size_t i = 0; i < promoted.size(); ++i) {
    const std::vector<float>& r = promoted[i].record;
    table.rows.set_tick(promoted[i].touched);
    const int64_t row = table.rows.Add(promoted_ids[i], {r.data(), dim},
                                       {r.data() + dim, r.size() - dim}, promoted[i].updates);
    table.rows.set_has_copy(row, true);
  }
  table.rows.set_tick(tick);
  table.disk_copies += static_cast<int64_t>(promoted.size());
  table.rows_promoted += static_cast<int64_t>(promoted.size());
  return absl::OkStatus();
}

void EmbeddingTable::StoreNewRows(Embedding& table, std::span<const StagedNewRow> rows,
                                  int64_t tick) {
  const size_t dim = table.dim();
  const size_t width = table.record_floats();
  DiskRows::Batch batch;
  for (const StagedNewRow& row : rows) batch.Put(row.id, {row.record, width}, row.updates, tick);
  absl::Status written = table.WriteDisk(batch);
  if (written.ok()) return;
  // A commit cannot fail: the rows stay in RAM past its limit, and the next
  // update that needs room makes it, or is refused while the disk still
  // fails.
  spdlog::error("{}; {} new row(s) kept in RAM past the table's limit instead",
                std::string(written.message()), rows.size());
  for (const StagedNewRow& row : rows) {
    table.rows.Add(row.id, {row.record, dim}, {row.record + dim, width - dim}, row.updates);
  }
}

absl::Status EmbeddingTable::Expire(Embedding& table) {
  // Only before an update's first part: removing rows moves others,
  // which a staged part would have found where they were.
  if (table.staged) return absl::OkStatus();
  // Sweeps run at updates that are multiples of the period, a function
  // of the table's update count alone, so every run expires the same rows
  // at the same update.
  const int64_t tick = table.updates + 1;
  const int64_t period = std::max<int64_t>(1, table.ttl() / 8);
  if (tick % period != 0) return absl::OkStatus();
  const int64_t oldest_kept = tick - table.ttl();  // touched before it: untouched for ttl updates
  std::vector<int64_t> expired_rows;               // in RAM, highest first (as Admit removes)
  for (int64_t row = table.rows.size() - 1; row >= 0; --row) {
    if (table.rows.touched(row) < oldest_kept) expired_rows.push_back(row);
  }
  if (table.tiered()) {
    // The rows only the disk holds, and the disk copies of the rows RAM
    // expires; a disk copy of a row RAM keeps is that row's, not expired.
    DiskRows::Batch batch;
    std::vector<uint64_t> expired;
    PST_RETURN_IF_ERROR(table.disk->ForEach([&](uint64_t id, const DiskRow& row) {
      if (row.touched < oldest_kept && table.rows.Find(id) < 0) {
        batch.Delete(id);
        if (table.track_changes) expired.push_back(id);
      }
    }));
    const int64_t disk_only = static_cast<int64_t>(batch.deletes());
    int64_t copies = 0;
    for (int64_t row : expired_rows) {
      if (table.rows.has_copy(row)) {
        batch.Delete(table.rows.id(row));
        ++copies;
      }
    }
    PST_RETURN_IF_ERROR(table.WriteDisk(batch));
    table.disk_copies -= copies;
    for (uint64_t id : expired) table.NoteRemoved(id);
    table.rows_expired += disk_only;
  }
  for (int64_t row : expired_rows) {
    table.NoteRemoved(table.rows.id(row));
    table.rows.Remove(row);
    ++table.rows_expired;
  }
  return absl::OkStatus();
}

}  // namespace pst
