#include "ps_server/core/row_step.h"

#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "common/tensor_codec.h"

namespace pst {

uint64_t RowId(const std::string& ids, int64_t i) {
  uint64_t id;
  // Little-endian hosts only (common/tensor_codec.h refuses to build
  // elsewhere), so the wire's bytes are the value's.
  std::memcpy(&id, ids.data() + i * sizeof(uint64_t), sizeof(id));
  return id;
}

RowStep::RowStep(int num_workers) : ranks_(num_workers) {}

void RowStep::Land(int rank, const PushRequest& push, std::span<const int> tables,
                   std::span<const int> dims) {
  united_table_.store(-1, std::memory_order_relaxed);
  Rank& r = ranks_[rank];
  r.landed = true;
  r.parts = push.rows_size();
  if (r.buffers.size() < static_cast<size_t>(r.parts)) r.buffers.resize(r.parts);
  for (int i = 0; i < push.rows_size(); ++i) {
    const EmbeddingRows& in = push.rows(i);
    Part& part = r.buffers[i];
    part.table = tables[i];
    const size_t n = in.ids().size() / sizeof(uint64_t);
    part.ids.resize(n);
    if (n > 0) std::memcpy(part.ids.data(), in.ids().data(), n * sizeof(uint64_t));
    part.rows.resize(n * dims[part.table]);
    DecodeValues(in.data(), in.dtype(), part.rows);
  }
}

int RowStep::landed() const {
  int landed = 0;
  for (const Rank& r : ranks_) landed += r.landed;
  return landed;
}

const RowStep::Part* RowStep::PartOf(int rank, int table) const {
  const Rank& r = ranks_[rank];
  if (!r.landed) return nullptr;
  for (int p = 0; p < r.parts; ++p) {
    if (r.buffers[p].table == table) return &r.buffers[p];
  }
  return nullptr;
}

std::span<const uint64_t> RowStep::ids(int rank, int table) const {
  const Part* part = PartOf(rank, table);
  if (part == nullptr) return {};
  return part->ids;
}

bool RowStep::SameIds(int a, int b) const {
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    const Part* x = PartOf(static_cast<int>(rank), a);
    const Part* y = PartOf(static_cast<int>(rank), b);
    if ((x == nullptr) != (y == nullptr)) return false;
    if (x != nullptr && x->ids != y->ids) return false;
  }
  return true;
}

void RowStep::Unite(int table) const {
  united_table_.store(table, std::memory_order_relaxed);
  united_ids_.clear();
  united_origins_.clear();
  places_.resize(ranks_.size());
  size_t landed_ids = 0;
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    if (const Part* part = PartOf(static_cast<int>(rank), table)) landed_ids += part->ids.size();
  }
  // Sized once for every id landed: growing it as ids come rehashes it
  // several times a step.
  absl::flat_hash_map<uint64_t, uint32_t> place;
  place.reserve(landed_ids);
  united_ids_.reserve(landed_ids);
  united_origins_.reserve(landed_ids);
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    std::vector<uint32_t>& places = places_[rank];
    places.clear();
    const Part* part = PartOf(static_cast<int>(rank), table);
    if (part == nullptr) continue;
    places.resize(part->ids.size());
    for (size_t i = 0; i < part->ids.size(); ++i) {
      auto [it, added] = place.emplace(part->ids[i], static_cast<uint32_t>(united_ids_.size()));
      if (added) {
        united_ids_.push_back(part->ids[i]);
        united_origins_.push_back({static_cast<int32_t>(rank), static_cast<uint32_t>(i)});
      }
      places[i] = it->second;
    }
  }
}

void RowStep::Mean(int table, int dim, std::vector<uint64_t>* ids, std::vector<float>* rows,
                   std::vector<Origin>* origins) const {
  const int united = united_table_.load(std::memory_order_relaxed);
  if (united < 0 || (united != table && !SameIds(united, table))) {
    Unite(table);
  }
  ids->assign(united_ids_.begin(), united_ids_.end());
  if (origins != nullptr) origins->assign(united_origins_.begin(), united_origins_.end());
  // Per id, 0 + g_0 + g_1 + ...: the ranks in order, each adding its row
  // for the id where it has one.
  rows->assign(united_ids_.size() * dim, 0.0f);
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    const Part* part = PartOf(static_cast<int>(rank), table);
    if (part == nullptr) continue;
    const std::vector<uint32_t>& places = places_[rank];
    for (size_t i = 0; i < places.size(); ++i) {
      float* sum = rows->data() + size_t{places[i]} * dim;
      const float* g = part->rows.data() + i * dim;
      for (int e = 0; e < dim; ++e) sum[e] += g[e];
    }
  }
  const int n = landed();
  if (n == 0) return;
  const float scale = 1.0f / static_cast<float>(n);
  for (float& v : *rows) v *= scale;
}

void RowStep::Clear() {
  united_table_.store(-1, std::memory_order_relaxed);
  for (Rank& r : ranks_) {
    r.landed = false;
    r.parts = 0;
  }
}

}  // namespace pst
