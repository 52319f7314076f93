// An embedding table's parts of a ShardCheckpoint, as both of its writers
// put them: a checkpoint (embedding_checkpoint.cc) and the changes a
// primary forwards to its backups, in a delta's form
// (embedding_changes.cc). Not for use outside them.
#ifndef PST_PS_SERVER_CORE_EMBEDDING_CHECKPOINT_PARTS_H_
#define PST_PS_SERVER_CORE_EMBEDDING_CHECKPOINT_PARTS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ps.pb.h"

namespace pst {
namespace embedding_internal {

// How far ahead a walk over many rows hints the next ones' cache lines.
constexpr size_t kRowsAhead = 8;

// One table's part of a checkpoint: what it is, its counters, and its
// rows from `Rows` (a RowStore, or a view of one frozen earlier).
struct TableHeader {
  EmbeddingTableConfig config;
  uint64_t seed;
  int num_shards;
  int64_t updates;
  int64_t rows_admitted;
  int64_t rows_refused;
  int64_t rows_evicted;
  int64_t rows_demoted;
  int64_t rows_promoted;
  int64_t rows_expired;
  size_t slot_floats;
  // RAM rows whose disk copy the tier holds too (the RAM row is the row).
  int64_t disk_copies;
};

// (A template: EmbeddingTable::Embedding is not to be named here.)
template <typename Table>
TableHeader HeaderOf(const Table& table, int num_shards) {
  return {.config = table.config,
          .seed = table.seed,
          .num_shards = num_shards,
          .updates = table.updates,
          .rows_admitted = table.rows_admitted,
          .rows_refused = table.rows_refused,
          .rows_evicted = table.rows_evicted,
          .rows_demoted = table.rows_demoted,
          .rows_promoted = table.rows_promoted,
          .rows_expired = table.rows_expired,
          .slot_floats = table.slot_floats(),
          .disk_copies = table.disk_copies};
}

// The table's part of `checkpoint`, with its header written in.
ShardCheckpoint::Embedding* AddTable(const TableHeader& header, ShardCheckpoint* checkpoint);

// Row `row` of `in` (dim values, then `slots` floats of state) into
// `record`, which holds dim + slots floats; returns its update count.
int64_t RowOfCheckpoint(const ShardCheckpoint::Embedding& in, int64_t row, size_t dim, size_t slots,
                        float* record);

// A delta's part of one table (ShardCheckpoint.delta): its header and
// the ids in `removed` written at once, in id order (the same file for the
// same changes), then its rows appended one by one, `rows` of them at most.
class DeltaPart {
 public:
  DeltaPart(const TableHeader& header, const std::vector<uint64_t>& removed, size_t rows,
            ShardCheckpoint* checkpoint);
  void Append(uint64_t id, int64_t updates, const float* values, const float* slots);
  // The rows whole, in columns (`values` dim floats a row, `slots` the
  // optimizer's), for a part constructed for none.
  void AssignRows(std::span<const uint64_t> ids, std::span<const int64_t> updates,
                  std::span<const float> values, std::span<const float> slots);

 private:
  const size_t dim_;
  const size_t slots_;
  ShardCheckpoint::Embedding* const out_;
};

}  // namespace embedding_internal
}  // namespace pst

#endif  // PST_PS_SERVER_CORE_EMBEDDING_CHECKPOINT_PARTS_H_
