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

  // Table `table`'s mean rows (dim values each, row after row) and their
  // ids, replacing `ids` and `rows`.
  void Mean(int table, int dim, std::vector<uint64_t>* ids, std::vector<float>* rows) const;

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
  std::vector<Rank> ranks_;
};

// Reads id `i` of `ids` (uint64, little-endian).
uint64_t RowId(const std::string& ids, int64_t i);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_ROW_STEP_H_
