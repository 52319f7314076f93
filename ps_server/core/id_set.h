// A set of row ids kept under the shard's lock: the ids an embedding
// table changed or removed since its last checkpoint capture
// (embedding_table_internal.h). IdSieve answers most questions of whether
// an id is not in such a set without a probe of it.
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
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
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
  template <typename Visit>
  void ForEach(Visit visit) const {
    for (const auto& part : parts_) {
      for (uint64_t id : part) visit(id);
    }
  }
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

// A Bloom filter of one IdSet: 32 bits an id (at most 8 MiB in all), two
// set by each id, at places its hash picks. An id the set holds is always
// answered yes; of the ids it does not hold, about one in 250 (one in 15
// for a set of 10^7, past the cap). A delta checkpoint scans every row of
// a table for the few changed ones: the filter of 10^5 ids (512 KiB) stays
// in cache, where the set's probes miss it, a row each.
class IdSieve {
 public:
  explicit IdSieve(const IdSet& ids)
      : bits_log2_(std::min(kMaxBitsLog2, static_cast<int>(std::bit_width(
                                              std::max<size_t>(64, 32 * ids.size()) - 1)))),
        words_((uint64_t{1} << bits_log2_) / 64) {
    ids.ForEach([this](uint64_t id) {
      const auto [first, second] = BitsOf(id);
      words_[first / 64] |= uint64_t{1} << (first % 64);
      words_[second / 64] |= uint64_t{1} << (second % 64);
    });
  }
  bool MayHold(uint64_t id) const {
    const auto [first, second] = BitsOf(id);
    return ((words_[first / 64] >> (first % 64)) & 1) != 0 &&
           ((words_[second / 64] >> (second % 64)) & 1) != 0;
  }
  size_t bytes() const { return words_.size() * sizeof(uint64_t); }

 private:
  static constexpr int kMaxBitsLog2 = 26;
  // Two fields of the hash's top bits, as the set's: its low bits chose
  // the shard.
  std::pair<uint64_t, uint64_t> BitsOf(uint64_t id) const {
    const uint64_t hash = RowHash(id);
    const uint64_t mask = (uint64_t{1} << bits_log2_) - 1;
    return {hash >> (64 - bits_log2_), (hash >> (64 - 2 * bits_log2_)) & mask};
  }

  const int bits_log2_;
  std::vector<uint64_t> words_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ID_SET_H_
