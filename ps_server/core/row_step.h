// The row gradients of the current SYNC step, per rank, and their mean.
//
// Land decodes a rank's rows as they arrive, outside the shard's lock;
// Mean then forms, per id, 0 + g_0 + g_1 + ... over the ranks that landed,
// in rank order (a rank whose push has no row for an id adds nothing),
// times 1/N for the N ranks that landed: what one worker with the step's
// whole batch would compute. The sums run in rank order whatever the
// arrival order, so the result is bitwise the same, and ids come out in a
// fixed order (each id where the lowest rank that has it lists it).
//
// Thread-safety: Land may run on several threads at once for different
// ranks; each writes only its rank's slot. The caller admits one push per
// rank per step and calls Mean and Clear only when no Land is under way.
#ifndef PST_PS_SERVER_CORE_ROW_STEP_H_
#define PST_PS_SERVER_CORE_ROW_STEP_H_

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ps.pb.h"

namespace pst {

class RowStep {
 public:
  explicit RowStep(int num_workers);

  // Adds `rank`'s rows: push.rows(i) belongs to table tables[i], whose
  // rows have dims[tables[i]] values; every part has been checked
  // (EmbeddingTable::CheckPush).
  void Land(int rank, const PushRequest& push, std::span<const int> tables,
            std::span<const int> dims);

  // The ranks that landed in this step.
  int landed() const;

  // Where a mean row's id is listed first: at `index` of rank `rank`'s
  // ids of the table.
  struct Origin {
    int32_t rank;
    uint32_t index;
  };
  // Table `table`'s mean rows (dim values each, row after row), their ids
  // and, where `origins` is given, where each id comes from, replacing
  // `ids`, `rows` and `origins`.
  void Mean(int table, int dim, std::vector<uint64_t>* ids, std::vector<float>* rows,
            std::vector<Origin>* origins = nullptr) const;
  // The ids rank `rank` landed for table `table` in this step (none if it
  // landed none).
  std::span<const uint64_t> ids(int rank, int table) const;

  // Empties the step (the ranks' buffers are kept for the next one).
  void Clear();

 private:
  struct Part {
    int table = 0;
    std::vector<uint64_t> ids;
    std::vector<float> rows;
  };
  struct Rank {
    bool landed = false;
    int parts = 0;  // of `buffers` in use
    std::vector<Part> buffers;
  };
  // Rank `rank`'s part of table `table`, or null.
  const Part* PartOf(int rank, int table) const;
  // Whether every rank landed the same ids, in the same order, for tables
  // `a` and `b`.
  bool SameIds(int a, int b) const;
  // Lists the ids of table `table` that the ranks landed, each once, in
  // Mean's order, into the union below.
  void Unite(int table) const;

  std::vector<Rank> ranks_;
  // The union of one table's ids this step (-1: none yet): each id once,
  // where it comes from, and each rank's ids' places in it. Tables that
  // the ranks name the same ids for (a CTR model's wide and deep tables
  // are fed the same ids) share it, so that only the first is hashed.
  // Formed by Mean, under the caller's exclusion of Land; Land and Clear
  // drop it.
  mutable std::atomic<int> united_table_ = -1;
  mutable std::vector<uint64_t> united_ids_;
  mutable std::vector<Origin> united_origins_;
  mutable std::vector<std::vector<uint32_t>> places_;
};

// Reads id `i` of `ids` (uint64, little-endian).
uint64_t RowId(const std::string& ids, int64_t i);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ROW_STEP_H_
