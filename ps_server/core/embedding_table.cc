#include "ps_server/core/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/embedding_config.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "placement/row_placement.h"
#include "ps_server/core/embedding_init.h"
#include "ps_server/core/embedding_table_internal.h"
#include "ps_server/core/variable_store.h"

namespace pst {

using embedding_internal::CheckIdBytes;
using embedding_internal::DrawRound;
using embedding_internal::IdCount;
using embedding_internal::Invalid;
using embedding_internal::kEvictionRounds;

EmbeddingTable::EmbeddingTable(EmbeddingTableOptions options)
    : options_(std::move(options)), step_(options_.num_workers) {}

EmbeddingTable::~EmbeddingTable() = default;

int64_t EmbeddingTable::parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& t : tables_) bytes += t->rows.size() * t->dim() * int64_t{sizeof(float)};
  return bytes;
}

int EmbeddingTable::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

int EmbeddingTable::dim(absl::string_view table) const {
  const int t = Find(table);
  return t < 0 ? 0 : tables_[t]->dim();
}

int64_t EmbeddingTable::row_limit(absl::string_view table) const {
  const int t = Find(table);
  return t < 0 ? 0 : tables_[t]->row_limit;
}

void EmbeddingTable::Adopt(std::vector<std::unique_ptr<Embedding>> tables) {
  tables_ = std::move(tables);
  index_.clear();
  dims_.clear();
  for (size_t t = 0; t < tables_.size(); ++t) {
    index_.emplace(tables_[t]->config.name(), static_cast<int>(t));
    dims_.push_back(tables_[t]->dim());
    tables_[t]->forward_changes = options_.forward_changes;
  }
  step_.Clear();
  // Rows found in the tables replaced are no one's now.
  pulled_.assign(options_.num_workers, std::vector<PulledRowsOf>(tables_.size()));
  initialized_ = true;
}

absl::Status EmbeddingTable::Initialize(const InitRequest& request) {
  PST_ASSIGN_OR_RETURN(std::vector<EmbeddingTableConfig> specs,
                       ResolveEmbeddingTables(request.embeddings(), options_.optimizer));
  if (std::any_of(specs.begin(), specs.end(),
                  [](const auto& spec) { return !spec.storage().disk().empty(); })) {
    // An earlier Initialize's tables (another table of the shard refused
    // that Init) let go of their disk tiers' directories first.
    Adopt({});
    initialized_ = false;
  }
  std::vector<std::unique_ptr<Embedding>> tables;
  for (EmbeddingTableConfig& spec : specs) {
    std::unique_ptr<Optimizer> rule = *MakeOptimizer(spec.optimizer());  // resolved: valid
    tables.push_back(std::make_unique<Embedding>(std::move(spec), std::move(rule), options_.seed));
    PST_RETURN_IF_ERROR(OpenDisk(*tables.back()));
  }
  for (const EmbeddingRows& part : request.rows()) {
    auto it = std::find_if(tables.begin(), tables.end(),
                           [&](const auto& t) { return t->config.name() == part.table(); });
    if (it == tables.end()) return Invalid(part.table(), "initial rows of no table of the Init");
    PST_RETURN_IF_ERROR(SeedRows(**it, part));
  }
  Adopt(std::move(tables));
  return absl::OkStatus();
}

absl::Status EmbeddingTable::SeedRows(Embedding& table, const EmbeddingRows& part) const {
  PST_RETURN_IF_ERROR(CheckIdBytes(part));
  const int64_t n = IdCount(part.ids());
  const size_t dim = table.dim();
  if (DTypeBytes(part.dtype()) == 0 ||
      static_cast<int64_t>(part.data().size()) != n * int64_t{table.dim()} * DTypeBytes(part.dtype())) {
    return Invalid(part.table(), absl::StrCat("initial rows: ", n, " ids, but their data is not ",
                                              n, " rows of ", dim, " values of a known dtype"));
  }
  if (!table.tiered() && table.rows.size() + n > table.row_limit) {
    return Invalid(part.table(), absl::StrCat("initial rows: ", table.rows.size() + n,
                                              " rows, more than the table's row limit (",
                                              table.row_limit, ")"));
  }
  std::vector<float> values(n * dim);
  DecodeValues(part.data(), part.dtype(), values);
  if (!AllFinite(values)) return Invalid(part.table(), "initial rows hold a non-finite value");
  const std::vector<float> slots(table.slot_floats(), table.optimizer->InitialSlotValue());
  // In a tiered table, the rows past the row limit go to disk.
  absl::flat_hash_set<uint64_t> spilled;
  DiskRows::Batch batch;
  std::vector<float> record(table.record_floats());
  std::copy(slots.begin(), slots.end(), record.begin() + dim);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t id;
    std::memcpy(&id, part.ids().data() + i * sizeof(uint64_t), sizeof(id));
    PST_RETURN_IF_ERROR(CheckShard(table, id, "initial row"));
    if (table.rows.Find(id) >= 0 || spilled.contains(id)) {
      return Invalid(part.table(), absl::StrCat("initial row id ", id, " given twice"));
    }
    if (table.rows.size() < table.row_limit) {
      table.rows.Add(id, {values.data() + i * dim, dim}, slots, 0);
    } else {
      // An earlier part of the Init may have sent it to disk already.
      PST_ASSIGN_OR_RETURN(bool on_disk, table.disk->Get(id, &cold_scratch_));
      if (on_disk) {
        return Invalid(part.table(), absl::StrCat("initial row id ", id, " given twice"));
      }
      spilled.insert(id);
      std::copy_n(values.data() + i * dim, dim, record.begin());
      batch.Put(id, record, 0, 0);
    }
    ++table.rows_admitted;
  }
  if (table.tiered()) PST_RETURN_IF_ERROR(table.WriteDisk(batch));
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckShard(const Embedding& table, uint64_t id,
                                        absl::string_view what) const {
  const int shard = ShardOfRow(id, options_.num_shards);
  if (shard == options_.shard) return absl::OkStatus();
  return Invalid(table.config.name(),
                 absl::StrCat(what, " id ", id, " belongs to shard ", shard, " of ",
                              options_.num_shards, ", not to this shard ", options_.shard));
}

absl::Status EmbeddingTable::CheckPush(const PushRequest& push, bool /*require_all*/,
                                       bool check_finite, TablePush* plan) const {
  plan->indices.clear();
  std::vector<bool> seen(tables_.size(), false);
  absl::flat_hash_set<uint64_t> ids;
  std::vector<float> row;
  for (const EmbeddingRows& part : push.rows()) {
    const int t = Find(part.table());
    if (t < 0) return Invalid(part.table(), "no such table on this shard (pushed rows)");
    if (seen[t]) return Invalid(part.table(), "rows pushed twice in one push");
    seen[t] = true;
    const Embedding& table = *tables_[t];
    PST_RETURN_IF_ERROR(CheckIdBytes(part));
    const int bytes = DTypeBytes(part.dtype());
    if (bytes == 0) {
      return Invalid(part.table(), absl::StrCat("unknown dtype ", static_cast<int>(part.dtype()),
                                                " of pushed rows"));
    }
    const int64_t n = IdCount(part.ids());
    const int64_t row_bytes = int64_t{table.dim()} * bytes;
    if (static_cast<int64_t>(part.data().size()) != n * row_bytes) {
      return Invalid(part.table(),
                     absl::StrCat("pushed rows carry ", part.data().size(), " bytes for ", n,
                                  " ids of dim ", table.dim(), "; expected ", n * row_bytes));
    }
    ids.clear();
    ids.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t id = RowId(part.ids(), i);
      PST_RETURN_IF_ERROR(CheckShard(table, id, "pushed"));
      if (!ids.insert(id).second) {
        return Invalid(part.table(), absl::StrCat("id ", id, " appears twice in one push"));
      }
    }
    if (check_finite && !EncodedFinite(part.data(), part.dtype())) {  // name the culprit
      row.resize(table.dim());
      for (int64_t i = 0; i < n; ++i) {
        DecodeValues(absl::string_view(part.data()).substr(i * row_bytes, row_bytes), part.dtype(),
                     row);
        if (!AllFinite(row)) {
          return Invalid(part.table(),
                         absl::StrCat("the gradient of id ", RowId(part.ids(), i),
                                      " has a non-finite value; nothing was applied"));
        }
      }
    }
    plan->indices.push_back(t);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::StageRows(Embedding& table, std::span<const uint64_t> ids,
                                       std::span<const float> gradients,
                                       const UpdateSettings& settings, KnownRows known) {
  if (table.tiered() || table.ttl() > 0) PST_RETURN_IF_ERROR(Admit(table, ids));
  const size_t dim = table.dim();
  const size_t slots = table.slot_floats();
  const size_t width = table.record_floats();
  const Optimizer& rule = *table.optimizer;
  // The table's decay counts the table's updates; Adam's bias correction,
  // each row's.
  Optimizer::Step row_step = settings.StepOf(rule, table.config.name(), table.updates + 1);
  std::vector<float> scaled(settings.gradient_scale != 1.0f ? dim : 0);
  std::vector<float> initial_slots(slots, rule.InitialSlotValue());
  table.staged = true;
  // The rows first, then their updates, each pass hinting the memory it
  // needs a few ids ahead: in a large table nearly every index entry and
  // row is a cache miss, and this lets them overlap.
  constexpr size_t kAhead = 8;
  std::span<const int64_t> found = known.rows;
  if (known.layout == 0 || known.layout != table.rows.layout() || known.rows.size() != ids.size()) {
    found_scratch_.resize(ids.size());
    table.rows.FindEach(ids, found_scratch_);
    found = found_scratch_;
  } else {
    rows_staged_as_pulled_ += static_cast<int64_t>(ids.size());
  }
  if (!table.tiered()) {  // Admit counted a tiered table's reads
    table.lookups_in_memory +=
        std::count_if(found.begin(), found.end(), [](int64_t row) { return row >= 0; });
  }
  const size_t saved = table.rows.saved_floats();
  // Rows updated in place are marked as Commit marks new ones.
  table.rows.set_tick(table.updates + 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size() && found[i + kAhead] >= 0) {
      table.rows.PrefetchRow(found[i + kAhead]);
    }
    const uint64_t id = ids[i];
    const int64_t row = found[i];
    if (row < 0 && !HasRoomForANewRow(table)) {
      ++table.staged_refused;
      continue;
    }
    float* next;
    const float* state = initial_slots.data();
    if (row < 0) {
      // The row starts from its initial value, where Commit will find it.
      const size_t at = table.staged_records.size();
      table.staged_records.resize(at + width);
      next = table.staged_records.data() + at;
      table.init.Row(id, {next, dim});
    } else {
      // Updated in place: the row's lines are read and written once, here.
      const size_t at = table.undo_records.size();
      table.undo_records.resize(at + saved);
      table.undo_ids.push_back(id);
      next = table.rows.BeginUpdate(row, table.undo_records.data() + at);
      state = next + dim;
    }
    const float* values = next;
    const int64_t step = (row < 0 ? 0 : table.rows.updates(row)) + 1;
    row_step.t = step;
    const float* grad = gradients.data() + i * dim;
    if (!scaled.empty()) {
      for (size_t k = 0; k < dim; ++k) scaled[k] = grad[k] * settings.gradient_scale;
      grad = scaled.data();
    }
    rule.ApplyRange(row_step,
                    Optimizer::Range{.count = dim,
                                     .param = values,
                                     .grad = grad,
                                     .slots = slots > 0 ? state : nullptr,
                                     .param_out = next,
                                     .slots_out = slots > 0 ? next + dim : nullptr,
                                     .slot_stride = dim});
    if (!AllFinite({next, width})) {
      return Invalid(table.config.name(),
                     absl::StrCat("the update of id ", id,
                                  " is not finite (the gradient is too large for the ",
                                  rule.Name(), " optimizer); nothing was applied"));
    }
    if (row >= 0) {
      table.rows.EndUpdate(row, step);
      table.ForwardRow(id, step, next);
    }
    table.staged_ids.push_back(id);
    table.staged_rows.push_back(row);
    table.staged_updates.push_back(step);
    if (row < 0) ++table.staged_new;
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::Stage(const PushRequest& push, const TablePush& plan,
                                   const UpdateSettings& settings) {
  for (size_t i = 0; i < plan.indices.size(); ++i) {
    const EmbeddingRows& part = push.rows(static_cast<int>(i));
    Embedding& table = *tables_[plan.indices[i]];
    const int64_t n = IdCount(part.ids());
    ids_scratch_.resize(n);
    if (n > 0) std::memcpy(ids_scratch_.data(), part.ids().data(), n * sizeof(uint64_t));
    rows_scratch_.resize(n * table.dim());
    DecodeValues(part.data(), part.dtype(), rows_scratch_);
    PST_RETURN_IF_ERROR(StageRows(table, ids_scratch_, rows_scratch_, settings, {}));
  }
  return absl::OkStatus();
}

double EmbeddingTable::SquaredNorm(const PushRequest& push, const TablePush& plan) const {
  std::vector<float> rows;
  double sum = 0.0;
  for (size_t i = 0; i < plan.indices.size(); ++i) {
    const EmbeddingRows& part = push.rows(static_cast<int>(i));
    rows.resize(IdCount(part.ids()) * tables_[plan.indices[i]]->dim());
    DecodeValues(part.data(), part.dtype(), rows);
    for (float g : rows) sum += static_cast<double>(g) * g;
  }
  return sum;
}

void EmbeddingTable::Land(int rank, const PushRequest& push, const TablePush& plan) {
  step_.Land(rank, push, plan.indices, dims_);
}

void EmbeddingTable::StepMean(size_t t) {
  if (t < step_means_.size()) {
    ids_scratch_.swap(step_means_[t].ids);
    rows_scratch_.swap(step_means_[t].rows);
    origins_scratch_.swap(step_means_[t].origins);
  } else {
    step_.Mean(static_cast<int>(t), tables_[t]->dim(), &ids_scratch_, &rows_scratch_,
               &origins_scratch_);
  }
}

EmbeddingTable::KnownRows EmbeddingTable::PulledRowsOfStep(size_t t) {
  const uint64_t layout = tables_[t]->rows.layout();
  // Per rank: whether its pull's rows are those of the ids it pushed.
  absl::InlinedVector<bool, 8> current(pulled_.size());
  for (size_t rank = 0; rank < pulled_.size(); ++rank) {
    const PulledRowsOf& pulled = pulled_[rank][t];
    const std::span<const uint64_t> pushed = step_.ids(static_cast<int>(rank), static_cast<int>(t));
    current[rank] = pulled.layout == layout && pulled.ids.size() == pushed.size() &&
                    std::equal(pushed.begin(), pushed.end(), pulled.ids.begin());
  }
  known_scratch_.resize(origins_scratch_.size());
  for (size_t i = 0; i < origins_scratch_.size(); ++i) {
    const RowStep::Origin origin = origins_scratch_[i];
    if (!current[origin.rank]) return {};
    known_scratch_[i] = pulled_[origin.rank][t].rows[origin.index];
  }
  return {.layout = layout, .rows = known_scratch_};
}

double EmbeddingTable::StepSquaredNorm() {
  step_means_.resize(tables_.size());
  double sum = 0.0;
  if (step_.landed() == 0) {
    step_means_.clear();
    return sum;
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    StepMeanRows& mean = step_means_[t];
    step_.Mean(static_cast<int>(t), tables_[t]->dim(), &mean.ids, &mean.rows, &mean.origins);
    for (float g : mean.rows) sum += static_cast<double>(g) * g;
  }
  return sum;
}

absl::Status EmbeddingTable::StageStep(const UpdateSettings& settings) {
  absl::Status staged = absl::OkStatus();
  if (step_.landed() > 0) {
    for (size_t t = 0; t < tables_.size() && staged.ok(); ++t) {
      Embedding& table = *tables_[t];
      StepMean(t);
      if (ids_scratch_.empty()) continue;
      staged = StageRows(table, ids_scratch_, rows_scratch_, settings, PulledRowsOfStep(t));
    }
  }
  step_means_.clear();
  step_.Clear();
  return staged;
}

void EmbeddingTable::Commit() {
  for (const auto& t : tables_) {
    Embedding& table = *t;
    if (!table.staged) continue;
    const size_t dim = table.dim();
    const size_t width = table.record_floats();
    const size_t n = table.staged_ids.size();
    const int64_t tick = table.updates + 1;
    table.rows.set_tick(tick);
    // The rows RAM held are written already (and marked with the tick, so
    // that no eviction below takes them); the new ones are added.
    int64_t admitted = 0;
    int64_t refused = table.staged_refused;
    const float* record = table.staged_records.data();
    std::vector<StagedNewRow> to_disk;  // under LFU, once RAM is full
    for (size_t i = 0; i < n; ++i) {
      if (table.staged_rows[i] >= 0) {
        table.NoteChanged(table.staged_ids[i]);
        continue;
      }
      const float* next = record;
      record += width;
      if (table.new_rows_to_disk() && table.rows.size() >= table.row_limit) {
        to_disk.push_back({table.staged_ids[i], table.staged_updates[i], next});
      } else {
        // A tiered table made room when it admitted the update.
        if (!table.tiered() && table.rows.size() >= table.row_limit && !EvictOne(table, tick)) {
          ++refused;  // every row left was trained by this update
          continue;
        }
        table.rows.Add(table.staged_ids[i], {next, dim}, {next + dim, width - dim},
                       table.staged_updates[i]);
      }
      table.NoteChanged(table.staged_ids[i]);
      table.ForwardRow(table.staged_ids[i], table.staged_updates[i], next);
      ++admitted;
    }
    if (!to_disk.empty()) StoreNewRows(table, to_disk, tick);
    table.ForwardCommitted();
    table.rows_admitted += admitted;
    table.rows_refused += refused;
    ++table.updates;
    table.undo_ids.clear();  // committed: nothing for Discard below to put back
    table.undo_records.clear();
  }
  Discard();
}

int64_t EmbeddingTable::EvictionsPerUpdate(const Embedding& table) const {
  const int64_t share = table.row_limit / (8 * int64_t{std::max(1, options_.num_workers)});
  return std::max<int64_t>(64, share);
}

bool EmbeddingTable::HasRoomForANewRow(const Embedding& table) const {
  if (table.tiered()) return true;  // Admit made room, or the update's rows alone are more
  const int64_t over = table.rows.size() + table.staged_new + 1 - table.row_limit;
  if (over <= 0) return true;
  return table.config.when_full() == EmbeddingTableConfig::EVICT_LEAST_RECENTLY_USED &&
         over <= EvictionsPerUpdate(table);
}

bool EmbeddingTable::EvictOne(Embedding& table, int64_t tick) {
  // Sampled LRU: the oldest of a few rows drawn at random costs O(1) per
  // eviction and no list threaded through the rows (whose records must
  // stay put for frozen views); the oldest of 8 is on average older than
  // 8 in 9 of the table's rows. A row this update trains (touched at
  // `tick`) is never one.
  const int64_t size = table.rows.size();
  if (size == 0) return false;
  // The draws of an update follow from the table and its update count: a
  // run evicts the same rows every time, restored or not.
  table.DrawForUpdate(tick);
  int64_t victim = -1;
  for (int round = 0; round < kEvictionRounds && victim < 0; ++round) {
    for (const int64_t row : DrawRound(&table.eviction_draws, size, table.rows)) {
      const int64_t touched = table.rows.touched(row);
      if (touched < tick && (victim < 0 || table.Colder(row, victim))) victim = row;
    }
  }
  if (victim < 0) return false;
  table.NoteRemoved(table.rows.id(victim));
  table.rows.Remove(victim);
  ++table.rows_evicted;
  return true;
}

void EmbeddingTable::Discard() {
  for (const auto& t : tables_) {
    Embedding& table = *t;
    // Rows updated in place get their records back, wherever a tier's
    // moves have put them since.
    const size_t saved = table.rows.saved_floats();
    for (size_t k = 0; k < table.undo_ids.size(); ++k) {
      table.rows.Restore(table.rows.Find(table.undo_ids[k]), table.undo_records.data() + k * saved);
    }
    table.undo_ids.clear();
    table.undo_records.clear();
    table.ForwardNoneStaged();
    table.staged = false;
    table.staged_ids.clear();
    table.staged_rows.clear();
    table.staged_updates.clear();
    table.staged_records.clear();
    table.staged_new = 0;
    table.staged_refused = 0;
  }
}

void EmbeddingTable::AddStats(StatsResponse* response) const {
  response->set_parameter_bytes(response->parameter_bytes() + parameter_bytes());
  for (const auto& t : tables_) {
    EmbeddingTableStats* stats = response->add_embeddings();
    stats->set_table(t->config.name());
    stats->set_dim(t->dim());
    const int64_t on_disk = t->rows_on_disk();
    stats->set_rows(t->rows.size() + on_disk);
    stats->set_bytes(t->rows.bytes());
    stats->set_rows_admitted(t->rows_admitted);
    stats->set_rows_refused(t->rows_refused);
    stats->set_rows_evicted(t->rows_evicted);
    stats->set_rows_in_memory(t->rows.size());
    stats->set_rows_on_disk(on_disk);
    stats->set_disk_bytes(t->tiered() ? t->disk->bytes() : 0);
    stats->set_lookups_in_memory(t->lookups_in_memory);
    stats->set_disk_reads(t->disk_reads);
    stats->set_disk_read_hits(t->disk_read_hits);
    stats->set_rows_demoted(t->rows_demoted);
    stats->set_rows_promoted(t->rows_promoted);
    stats->set_rows_expired(t->rows_expired);
    stats->set_prefetch_hits(t->prefetch_hits);
    stats->set_disk_waits(t->disk_waits);
    stats->set_disk_reads_filtered(t->disk_reads_filtered);
    stats->set_rows_prefetched(t->prefetch != nullptr ? t->prefetch->prefetched() : 0);
  }
}

}  // namespace pst
