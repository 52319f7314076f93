#include "ps_server/row_store.h"

#include <algorithm>

#include "placement/row_placement.h"

namespace pst {

RowStore::RowStore(int dim, int slots_per_value) : dim_(dim), slots_per_value_(slots_per_value) {}

size_t RowStore::IndexPart(uint64_t id) {
  // The hash's top bits: its low bits chose the shard (ShardOfRow), so on
  // one shard of a power-of-two count they are the same for every row.
  return static_cast<size_t>(RowHash(id) >> 58) % kIndexParts;
}

int64_t RowStore::bytes() const {
  const int64_t per_block =
      kRowsPerBlock *
      static_cast<int64_t>(width() * sizeof(float) + sizeof(uint64_t) + sizeof(int64_t));
  int64_t bytes = static_cast<int64_t>(blocks_.size()) * per_block;
  for (const Index& part : index_) {
    // A slot per entry plus a control byte per slot (Abseil's Swiss table).
    bytes += static_cast<int64_t>(part.capacity() * (sizeof(Index::value_type) + 1));
  }
  return bytes;
}

int64_t RowStore::Find(uint64_t id) const {
  const Index& part = index_[IndexPart(id)];
  auto it = part.find(id);
  return it == part.end() ? -1 : static_cast<int64_t>(it->second);
}

int64_t RowStore::Add(uint64_t id, std::span<const float> values, std::span<const float> slots,
                      int64_t updates) {
  const int64_t row = size_;
  if (row % kRowsPerBlock == 0) {
    Block b;
    b.records.reset(new float[kRowsPerBlock * width()]);
    b.ids.reset(new uint64_t[kRowsPerBlock]);
    b.updates.reset(new int64_t[kRowsPerBlock]);
    blocks_.push_back(std::move(b));
  }
  ++size_;
  Block& b = block(row);
  b.ids[row % kRowsPerBlock] = id;
  b.updates[row % kRowsPerBlock] = updates;
  std::copy(values.begin(), values.end(), this->values(row).begin());
  std::copy(slots.begin(), slots.end(), this->slots(row).begin());
  index_[IndexPart(id)].emplace(id, static_cast<uint32_t>(row));
  return row;
}

}  // namespace pst
