// A set of row ids kept under the shard's lock: the ids an embedding
// table changed or removed since its last checkpoint capture
// (embedding_table_internal.h).
//
// It is split into kParts hash sets by the id's hash, as RowStore's index
// is, so that growing it rehashes one small part at a time: a set of
// millions of ids rehashed whole would hold the shard's updates back for
// as long as that takes. Moving one out (std::exchange with an empty one)
// costs a pointer move per part, and allocates nothing.
//
// Not thread-safe: the owner serializes access.
#ifndef PST_PS_SERVER_CORE_ID_SET_H_
#define PST_PS_SERVER_CORE_ID_SET_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "placement/row_placement.h"

namespace pst {

class IdSet {
 public:
  static constexpr int kParts = 64;

  void insert(uint64_t id) { part(id).insert(id); }
  // Whether `id` was in the set.
  bool erase(uint64_t id) { return part(id).erase(id) > 0; }
  bool contains(uint64_t id) const { return parts_[PartOf(id)].contains(id); }
  // Cache hint: `id` will be looked up soon.
  void Prefetch(uint64_t id) const { parts_[PartOf(id)].prefetch(id); }
  size_t size() const {
    size_t n = 0;
    for (const auto& part : parts_) n += part.size();
    return n;
  }
  // The ids, in increasing order.
  std::vector<uint64_t> Sorted() const {
    std::vector<uint64_t> ids;
    ids.reserve(size());
    for (const auto& part : parts_) ids.insert(ids.end(), part.begin(), part.end());
    std::sort(ids.begin(), ids.end());
    return ids;
  }

 private:
  // The hash's top bits, as RowStore::IndexPart: its low bits chose the
  // shard, so on one shard of a power-of-two count they are all alike.
  static size_t PartOf(uint64_t id) { return static_cast<size_t>(RowHash(id) >> 58) % kParts; }
  absl::flat_hash_set<uint64_t>& part(uint64_t id) { return parts_[PartOf(id)]; }

  std::array<absl::flat_hash_set<uint64_t>, kParts> parts_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ID_SET_H_
