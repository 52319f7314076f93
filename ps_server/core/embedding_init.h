// The initial value of an embedding row: a pure function of the job's
// seed, the table's name, the row's id and the element, so every shard,
// every worker and every restart computes the same row without storing or
// sending it. Counter-based (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", 2011): each element hashes its own coordinates, so no
// generator state is kept and rows are computed in any order.
//
//   step(x)   = RowHash(x)   (a SplitMix64 step, placement/row_placement.h)
//   name_hash = FNV-1a 64 of the table's name bytes
//   key       = step(seed ^ name_hash)                      (TableInitKey)
//   h         = step(step(key ^ id) ^ element)
//   u         = (h >> 40) / 2^24                             (24 bits, in [0, 1))
//   value     = scale * (2u - 1) in float, uniform in [-scale, scale);
//               exactly +0 when scale is 0.
//
// 2u - 1 is exact in float; the product with scale rounds once.
#ifndef PST_PS_SERVER_CORE_EMBEDDING_INIT_H_
#define PST_PS_SERVER_CORE_EMBEDDING_INIT_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/strings/string_view.h"
#include "config.pb.h"

namespace pst {

uint64_t TableInitKey(uint64_t seed, absl::string_view table);

// Writes the initial values of row `id` (out.size() elements) of the table
// with key `key`.
void InitialRow(uint64_t key, uint64_t id, float scale, std::span<float> out);

// The initial rows of one resolved table (common/embedding_config.h): a
// table of parts (EmbeddingTableConfig.parts) starts each part's columns
// as a table of the part's name and init_scale would start its rows, so
// that tables kept side by side start, and train, as they would apart; a
// table without parts is its own one part.
class TableInit {
 public:
  TableInit(uint64_t seed, const EmbeddingTableConfig& spec);
  // Row `id`'s initial values; out.size() is the table's dim.
  void Row(uint64_t id, std::span<float> out) const;
  // The key of the table's name: a seed for the table's own draws.
  uint64_t key() const { return key_; }

 private:
  struct Part {
    uint64_t key;
    float scale;
    size_t dim;
  };
  uint64_t key_;
  std::vector<Part> parts_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_EMBEDDING_INIT_H_
