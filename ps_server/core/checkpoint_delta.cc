#include "ps_server/core/checkpoint_delta.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pst {
namespace {

absl::Status DeltaMismatch(const std::string& table, absl::string_view problem) {
  return absl::DataLossError(
      absl::StrCat("the delta does not fit its parent: embedding table \"", table, "\" ", problem));
}

uint64_t IdAt(const std::string& ids, int64_t row) {
  uint64_t id;
  std::memcpy(&id, ids.data() + row * sizeof(uint64_t), sizeof(id));
  return id;
}

// The bytes one row takes in each of a table's four columns.
struct RowBytes {
  size_t values;
  size_t slots;
};

// Checks that `table`'s columns hold whole rows of `bytes`, or infers its
// slot bytes (`*bytes->slots` unset: SIZE_MAX) from them.
absl::Status CheckColumns(const ShardCheckpoint::Embedding& table, RowBytes* bytes) {
  const std::string& name = table.config().name();
  if (table.ids().size() % sizeof(uint64_t) != 0 ||
      table.removed_ids().size() % sizeof(uint64_t) != 0) {
    return DeltaMismatch(name, "has ids of other than 8 bytes");
  }
  const size_t n = table.ids().size() / sizeof(uint64_t);
  if (bytes->slots == SIZE_MAX && n > 0) {
    if (table.slots().size() % n != 0) return DeltaMismatch(name, "has slots of no whole rows");
    bytes->slots = table.slots().size() / n;
  }
  if (table.values().size() != n * bytes->values ||
      (n > 0 && table.slots().size() != n * bytes->slots) || (n == 0 && !table.slots().empty()) ||
      table.row_updates().size() != n * sizeof(int64_t)) {
    return DeltaMismatch(name, "holds ids, values, slots and updates of different row counts");
  }
  return absl::OkStatus();
}

// Writes `delta`'s rows over `parent`'s (see ApplyDelta), then moves the
// merged rows into `delta`, whose header is the newer.
absl::Status MergeRows(ShardCheckpoint::Embedding* parent, ShardCheckpoint::Embedding* delta) {
  const std::string& name = delta->config().name();
  if (parent->config().dim() != delta->config().dim()) {
    return DeltaMismatch(name, absl::StrCat("has dim ", delta->config().dim(), ", its parent ",
                                            parent->config().dim()));
  }
  RowBytes bytes{.values = delta->config().dim() * sizeof(float), .slots = SIZE_MAX};
  PST_RETURN_IF_ERROR(CheckColumns(*delta, &bytes));
  PST_RETURN_IF_ERROR(CheckColumns(*parent, &bytes));
  if (bytes.slots == SIZE_MAX) bytes.slots = 0;  // no row on either side

  std::string& ids = *parent->mutable_ids();
  std::string& values = *parent->mutable_values();
  std::string& slots = *parent->mutable_slots();
  std::string& updates = *parent->mutable_row_updates();
  const auto n = static_cast<int64_t>(ids.size() / sizeof(uint64_t));
  absl::flat_hash_map<uint64_t, int64_t> where;
  where.reserve(n);
  for (int64_t row = 0; row < n; ++row) {
    if (!where.emplace(IdAt(ids, row), row).second) {
      return DeltaMismatch(name, absl::StrCat("holds id ", IdAt(ids, row), " twice in its parent"));
    }
  }
  std::vector<bool> dropped(n, false);
  const std::string& removed = delta->removed_ids();
  for (size_t i = 0; i < removed.size() / sizeof(uint64_t); ++i) {
    // An id created and removed since the parent was never in it.
    if (auto it = where.find(IdAt(removed, static_cast<int64_t>(i))); it != where.end()) {
      dropped[it->second] = true;
      where.erase(it);
    }
  }
  const auto changed = static_cast<int64_t>(delta->ids().size() / sizeof(uint64_t));
  for (int64_t d = 0; d < changed; ++d) {
    const uint64_t id = IdAt(delta->ids(), d);
    const char* value = delta->values().data() + d * bytes.values;
    const char* slot = delta->slots().data() + d * bytes.slots;
    const char* count = delta->row_updates().data() + d * sizeof(int64_t);
    auto it = where.find(id);
    if (it == where.end()) {
      where.emplace(id, static_cast<int64_t>(ids.size() / sizeof(uint64_t)));
      ids.append(delta->ids().data() + d * sizeof(uint64_t), sizeof(uint64_t));
      values.append(value, bytes.values);
      slots.append(slot, bytes.slots);
      updates.append(count, sizeof(int64_t));
      continue;
    }
    const int64_t row = it->second;
    std::memcpy(values.data() + row * bytes.values, value, bytes.values);
    if (bytes.slots > 0) std::memcpy(slots.data() + row * bytes.slots, slot, bytes.slots);
    std::memcpy(updates.data() + row * sizeof(int64_t), count, sizeof(int64_t));
  }
  // The removed rows out, the others keeping their order.
  const auto total = static_cast<int64_t>(ids.size() / sizeof(uint64_t));
  int64_t kept = 0;
  for (int64_t row = 0; row < total; ++row) {
    if (row < n && dropped[row]) continue;
    if (kept != row) {
      std::memmove(ids.data() + kept * sizeof(uint64_t), ids.data() + row * sizeof(uint64_t),
                   sizeof(uint64_t));
      std::memmove(values.data() + kept * bytes.values, values.data() + row * bytes.values,
                   bytes.values);
      if (bytes.slots > 0) {
        std::memmove(slots.data() + kept * bytes.slots, slots.data() + row * bytes.slots,
                     bytes.slots);
      }
      std::memmove(updates.data() + kept * sizeof(int64_t), updates.data() + row * sizeof(int64_t),
                   sizeof(int64_t));
    }
    ++kept;
  }
  ids.resize(kept * sizeof(uint64_t));
  values.resize(kept * bytes.values);
  slots.resize(kept * bytes.slots);
  updates.resize(kept * sizeof(int64_t));
  delta->mutable_ids()->swap(ids);
  delta->mutable_values()->swap(values);
  delta->mutable_slots()->swap(slots);
  delta->mutable_row_updates()->swap(updates);
  delta->clear_removed_ids();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardCheckpoint> ApplyDelta(ShardCheckpoint parent, ShardCheckpoint delta) {
  if (!delta.delta()) return absl::InvalidArgumentError("ApplyDelta: the checkpoint is no delta");
  if (parent.delta() || parent.version() != delta.parent_version()) {
    return absl::DataLossError(
        absl::StrCat("the delta at version ", delta.version(), " is over version ",
                     delta.parent_version(), ", its parent holds ",
                     parent.delta() ? "a delta at version " : "version ", parent.version()));
  }
  if (parent.shard() != delta.shard()) {
    return absl::DataLossError(absl::StrCat("the delta is shard ", delta.shard(),
                                            "'s, its parent shard ", parent.shard(), "'s"));
  }
  if (parent.embeddings_size() != delta.embeddings_size()) {
    return absl::DataLossError(absl::StrCat("the delta holds ", delta.embeddings_size(),
                                            " embedding tables, its parent ",
                                            parent.embeddings_size()));
  }
  for (ShardCheckpoint::Embedding& table : *delta.mutable_embeddings()) {
    ShardCheckpoint::Embedding* from = nullptr;
    for (ShardCheckpoint::Embedding& candidate : *parent.mutable_embeddings()) {
      if (candidate.config().name() == table.config().name()) from = &candidate;
    }
    if (from == nullptr) return DeltaMismatch(table.config().name(), "is not in its parent");
    PST_RETURN_IF_ERROR(MergeRows(from, &table));
  }
  delta.clear_delta();
  delta.clear_parent_version();
  delta.clear_base_version();
  return delta;
}

}  // namespace pst
