#include "ps_server/core/embedding_init.h"

#include <algorithm>

#include "placement/row_placement.h"

namespace pst {

uint64_t TableInitKey(uint64_t seed, absl::string_view table) {
  uint64_t name_hash = 0xcbf29ce484222325ULL;
  for (char c : table) {
    name_hash ^= static_cast<unsigned char>(c);
    name_hash *= 0x100000001b3ULL;
  }
  return RowHash(seed ^ name_hash);
}

void InitialRow(uint64_t key, uint64_t id, float scale, std::span<float> out) {
  if (scale == 0.0f) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  const uint64_t row = RowHash(key ^ id);
  constexpr float kUnit = 1.0f / static_cast<float>(uint64_t{1} << 24);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t h = RowHash(row ^ static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * kUnit;
    out[i] = scale * (2.0f * u - 1.0f);
  }
}

TableInit::TableInit(uint64_t seed, const EmbeddingTableConfig& spec)
    : key_(TableInitKey(seed, spec.name())) {
  if (spec.parts().empty()) {
    parts_.push_back({key_, spec.init_scale(), static_cast<size_t>(spec.dim())});
    return;
  }
  for (const EmbeddingTablePart& part : spec.parts()) {
    parts_.push_back(
        {TableInitKey(seed, part.name()), part.init_scale(), static_cast<size_t>(part.dim())});
  }
}

void TableInit::Row(uint64_t id, std::span<float> out) const {
  size_t at = 0;
  for (const Part& part : parts_) {
    InitialRow(part.key, id, part.scale, out.subspan(at, part.dim));
    at += part.dim;
  }
}

}  // namespace pst
