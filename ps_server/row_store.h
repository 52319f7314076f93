// One embedding table's rows on one shard: each row's id, values,
// optimizer state and the updates applied to it.
//
// Rows live in blocks of kRowsPerBlock rows that are never moved, so a
// growing table never copies the rows it holds (with millions of rows, a
// reallocation would stall the shard's lock for the copy), and what it
// holds beyond its rows is at most one block. The id index is split into
// kIndexParts maps by the id's hash, so growing the index rehashes one
// small map at a time, never the whole index.
//
// Not thread-safe: the owner serializes access.
#ifndef PST_PS_SERVER_ROW_STORE_H_
#define PST_PS_SERVER_ROW_STORE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace pst {

class RowStore {
 public:
  static constexpr int64_t kRowsPerBlock = 1024;
  static constexpr int kIndexParts = 64;

  // Rows of `dim` values and `slots_per_value` * dim floats of optimizer
  // state, slot-major within the row (slot s of value i at s * dim + i).
  RowStore(int dim, int slots_per_value);

  int dim() const { return dim_; }
  int64_t size() const { return size_; }
  // Memory the rows take: blocks, index and its control bytes.
  int64_t bytes() const;

  // The index of `id`'s row, or -1.
  int64_t Find(uint64_t id) const;
  // Cache hints: `id` will be looked up soon; row `row` will be read soon.
  // Rows of a large table are scattered over memory, so a caller about to
  // visit many of them hints a few ahead, and the misses overlap.
  void PrefetchIndex(uint64_t id) const { index_[IndexPart(id)].prefetch(id); }
  void PrefetchRow(int64_t row) const {
    const float* at = record(row);
    for (size_t line = 0; line < width() * sizeof(float); line += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(at) + line);
    }
  }
  // Adds a row for `id`, which has none, with the given contents (dim
  // values, slots_per_value * dim slots); returns its index.
  int64_t Add(uint64_t id, std::span<const float> values, std::span<const float> slots,
              int64_t updates);

  uint64_t id(int64_t row) const { return block(row).ids[row % kRowsPerBlock]; }
  std::span<const float> values(int64_t row) const { return {record(row), size_t(dim_)}; }
  std::span<float> values(int64_t row) { return {record(row), size_t(dim_)}; }
  std::span<const float> slots(int64_t row) const { return {record(row) + dim_, slot_floats()}; }
  std::span<float> slots(int64_t row) { return {record(row) + dim_, slot_floats()}; }
  int64_t updates(int64_t row) const { return block(row).updates[row % kRowsPerBlock]; }
  void set_updates(int64_t row, int64_t updates) {
    block(row).updates[row % kRowsPerBlock] = updates;
  }

 private:
  // A row's record is its values, then its slots.
  struct Block {
    std::unique_ptr<float[]> records;
    std::unique_ptr<uint64_t[]> ids;
    std::unique_ptr<int64_t[]> updates;
  };
  using Index = absl::flat_hash_map<uint64_t, uint32_t>;

  size_t slot_floats() const { return static_cast<size_t>(slots_per_value_) * dim_; }
  size_t width() const { return static_cast<size_t>(dim_) + slot_floats(); }
  const Block& block(int64_t row) const { return blocks_[row / kRowsPerBlock]; }
  Block& block(int64_t row) { return blocks_[row / kRowsPerBlock]; }
  float* record(int64_t row) const {
    return blocks_[row / kRowsPerBlock].records.get() + (row % kRowsPerBlock) * width();
  }
  static size_t IndexPart(uint64_t id);

  const int dim_;
  const int slots_per_value_;
  int64_t size_ = 0;
  std::vector<Block> blocks_;
  std::array<Index, kIndexParts> index_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_ROW_STORE_H_
