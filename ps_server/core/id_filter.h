// Which ids a disk tier may hold: a Bloom filter that grows with the ids
// added to it, so that a read of an id the tier never stored (most reads of
// a tiered table's cold rows are of new ids) is answered without asking
// RocksDB, which would probe the filter of each of its files (up to a few
// dozen cache misses) before saying so.
//
// MayHold(id) is true for every id added; for others it is true with a
// small probability (about 1% a level, below). Nothing is ever removed: an
// id deleted from the tier stays a false positive, which costs one read.
//
// Layout. Levels of split-block Bloom filters (each id sets one bit in
// each of the eight 64-bit words of one 64-byte block, one cache line): a
// level holds twice the ids of the one before it at 10 bits an id, and Add
// goes to the newest until it holds its share, so no level is ever
// rebuilt and a query probes one line a level, the levels' lines asked for
// at once. The memory is at most about 2.5 bytes an id, and 320 KiB from
// the first id on.
//
// Thread-safety: one thread Adds (the tier's owner); MayHold may run on any
// thread at the same time. An id's bits are set before Add returns, so a
// reader ordered after an Add (by a lock or an atomic both use) sees it;
// one that overlaps it may not, which the disk tier allows since the row
// it adds is not written yet.
#ifndef PST_PS_SERVER_CORE_ID_FILTER_H_
#define PST_PS_SERVER_CORE_ID_FILTER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace pst {

class IdFilter {
 public:
  // The first level's ids (320 KiB); each next level holds twice the
  // last's.
  static constexpr int64_t kFirstLevelIds = int64_t{1} << 18;
  // Enough levels for 2^18 * (2^40 - 1) ids.
  static constexpr int kMaxLevels = 40;

  IdFilter() = default;
  ~IdFilter();
  IdFilter(const IdFilter&) = delete;
  IdFilter& operator=(const IdFilter&) = delete;

  void Add(uint64_t id);
  bool MayHold(uint64_t id) const;

  int64_t ids_added() const { return added_; }
  // Bytes of the levels allocated.
  int64_t bytes() const;

 private:
  struct Level {
    explicit Level(int64_t capacity);
    const int64_t capacity;  // ids
    const uint64_t blocks;
    std::unique_ptr<std::atomic<uint64_t>[]> words;  // 8 a block
  };

  std::array<std::atomic<Level*>, kMaxLevels> levels_{};
  std::atomic<int> level_count_{0};
  int64_t added_ = 0;            // over all levels
  int64_t added_to_newest_ = 0;  // of the newest level's capacity
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ID_FILTER_H_
