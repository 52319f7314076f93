// Which PS shard holds an embedding row: a stable hash of the row's 64-bit
// id, taken modulo the shard count. Every process computes it alike, so no
// row directory is ever kept or exchanged, and a checkpoint's rows belong
// to the same shards on every restart with the same shard count.
//
// The hash is SplitMix64's output function (Steele, Lea and Flood, "Fast
// splittable pseudorandom number generators", 2014) applied to the id plus
// the golden-ratio increment:
//   z = id + 0x9e3779b97f4a7c15
//   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
//   z = (z ^ (z >> 27)) * 0x94d049bb133111eb
//   RowHash(id) = z ^ (z >> 31)               (all arithmetic mod 2^64)
// It is a bijection that spreads consecutive and clustered ids evenly.
// Changing it moves every row of every checkpoint to another shard:
// tests/placement/row_placement_test.cc pins its values.
#ifndef PST_PLACEMENT_ROW_PLACEMENT_H_
#define PST_PLACEMENT_ROW_PLACEMENT_H_

#include <cstdint>

namespace pst {

// The SplitMix64 finalizer above, without the increment: a bijective mix
// of 64 bits, also used where a stable, counter-based hash is needed.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t RowHash(uint64_t id) { return Mix64(id + 0x9e3779b97f4a7c15ULL); }

// The shard of row `id` among `num_shards` (> 0) shards.
constexpr int ShardOfRow(uint64_t id, int num_shards) {
  return static_cast<int>(RowHash(id) % static_cast<uint64_t>(num_shards));
}

}  // namespace pst

#endif  // PST_PLACEMENT_ROW_PLACEMENT_H_
