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

void RowStep::Mean(int table, int dim, std::vector<uint64_t>* ids, std::vector<float>* rows) const {
  ids->clear();
  rows->clear();
  size_t landed_ids = 0;
  for (const Rank& r : ranks_) {
    for (int p = 0; p < r.parts; ++p) {
      if (r.buffers[p].table == table) landed_ids += r.buffers[p].ids.size();
    }
  }
  // Sized once for every id landed: growing it as ids come rehashes it
  // several times a step.
  absl::flat_hash_map<uint64_t, size_t> position;
  position.reserve(landed_ids);
  ids->reserve(landed_ids);
  rows->reserve(landed_ids * dim);
  for (const Rank& r : ranks_) {
    if (!r.landed) continue;
    for (int p = 0; p < r.parts; ++p) {
      const Part& part = r.buffers[p];
      if (part.table != table) continue;
      for (size_t i = 0; i < part.ids.size(); ++i) {
        auto [it, added] = position.emplace(part.ids[i], ids->size());
        if (added) {
          ids->push_back(part.ids[i]);
          rows->resize(rows->size() + dim, 0.0f);
        }
        float* sum = rows->data() + it->second * dim;
        const float* g = part.rows.data() + i * dim;
        for (int e = 0; e < dim; ++e) sum[e] += g[e];
      }
    }
  }
  const int n = landed();
  if (n == 0) return;
  const float scale = 1.0f / static_cast<float>(n);
  for (float& v : *rows) v *= scale;
}

void RowStep::Clear() {
  for (Rank& r : ranks_) {
    r.landed = false;
    r.parts = 0;
  }
}

}  // namespace pst
