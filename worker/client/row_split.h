// One exchange's embedding rows, split by the shard each id belongs to
// (placement/row_placement.h: ShardOfRow) and put back in the caller's
// order when the shards answer.
//
// A caller names, per table, unique ids in an order of its own; each
// shard gets its own ids in that order (with their gradient rows, in the
// wire dtype, for a push), and the rows a shard answers are scattered to
// the positions their ids had in the caller's list.
//
// A shard's pulled rows that one call cannot carry (its ids past what a
// request may hold, or their values past what an answer may) are pieced:
// part 0 goes with the exchange, and each further part is a pull of rows
// alone that follows it (PieceOutPull). Pushed rows are never pieced: a
// shard counts each push as one step of the worker's (SYNC aggregates one
// push per worker per step, ASYNC and SSP tick the worker's clock per push),
// so a push split in two would be two steps.
#ifndef PST_WORKER_CLIENT_ROW_SPLIT_H_
#define PST_WORKER_CLIENT_ROW_SPLIT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "config.pb.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "ps.pb.h"

namespace pst {

// The gradients of one embedding table's rows: ids[i]'s row is
// gradients[i * dim, (i + 1) * dim), the sum over the batch of that id's
// gradient. `table` indexes the client's tables (PsClient::
// SetEmbeddingTables). Ids are unique.
struct RowGradients {
  int table = 0;
  std::span<const uint64_t> ids;
  std::span<const float> gradients;
};

// Rows of one embedding table to fetch: ids[i]'s values go to
// values[i * dim, (i + 1) * dim). Ids are unique.
struct RowValues {
  int table = 0;
  std::span<const uint64_t> ids;
  std::span<float> values;
};

using EmbeddingRowsList = google::protobuf::RepeatedPtrField<EmbeddingRows>;

class RowSplit {
 public:
  // Checks the caller's rows and splits them over `num_shards` shards.
  // InvalidArgument, naming the table, before anything is sent: a table
  // index out of range, a table twice in `push` or in `pull`, an id twice
  // in one table's ids, or a gradient or value span that is not
  // ids.size() * dim floats. Where `push_every_table`, every shard's push
  // names every table (those the caller left out with no ids), so that
  // every shard sees a push even where the batch has none of its rows.
  static absl::StatusOr<RowSplit> Make(const std::vector<EmbeddingTableConfig>& tables,
                                       int num_shards, DType wire_dtype,
                                       std::span<const RowGradients> push,
                                       std::span<const RowValues> pull, bool push_every_table);

  // What one call to a shard may carry, in bytes, beside its other parts.
  struct PullBudget {
    int64_t request_bytes = 0;  // the ids named
    int64_t reply_bytes = 0;    // the values answered
  };
  // Splits shard s's pulled rows into parts of at most `first` (part 0,
  // which goes with the exchange) and `rest` (every further part, a pull of
  // rows alone), a table's ids over several parts where need be.
  // ResourceExhausted if a part cannot hold a single row.
  absl::Status PieceOutPull(int shard, const PullBudget& first, const PullBudget& rest);
  // Parts of shard s's pull (1 where it is not pieced, 0 where nothing pulls).
  int pull_parts(int shard) const { return static_cast<int>(shards_[shard].pulls.size()); }

  bool pushes() const { return pushes_; }
  bool pulls() const { return !pull_.empty(); }

  // Shard s's pushed rows (ids and gradients in the wire dtype), for a
  // push header: swapped in before the header is written and back after,
  // so that no row is copied and a call made again finds them.
  EmbeddingRowsList* push_rows(int shard) { return &shards_[shard].push; }
  // Bytes of shard s's pushed rows on the wire (ids, data and per-table
  // framing).
  int64_t push_rows_bytes(int shard) const;
  // Moves part `part` of shard s's ids to fetch into `request` (once per
  // exchange).
  void MovePullRows(int shard, int part, PullRequest* request);
  // Bytes of the values shard s answers for part `part` (ids x dim x wire
  // bytes, over its tables).
  int64_t pull_answer_bytes(int shard, int part) const;

  // Takes shard s's answer to part `part` (its rows, one per table asked,
  // in order) into the caller's values: from the answer's rows, or, where
  // the shard wrote them into a shared region, from `in_region` (the
  // tables' values one after another; the answer's rows then name the
  // tables with empty data). Internal if the answer does not match the ask.
  absl::Status TakeAnswer(int shard, int part, const PullResponse& answer,
                          std::optional<std::span<const char>> in_region = std::nullopt) const;

  // Bytes of rows pushed and answered, for the traffic counters.
  int64_t push_bytes() const { return push_bytes_; }
  int64_t pull_bytes() const { return pull_bytes_; }

 private:
  // One call's share of a shard's pulled rows.
  struct PullPart {
    EmbeddingRowsList rows;
    // Per pulled table (rows' order): the caller's RowValues index, and
    // the caller's position of each id sent.
    std::vector<int> pull_of;
    std::vector<std::vector<uint32_t>> positions;
  };
  struct PerShard {
    EmbeddingRowsList push;
    std::vector<PullPart> pulls;  // [0] goes with the exchange; more once pieced
  };
  RowSplit() = default;

  std::vector<EmbeddingTableConfig> const* tables_ = nullptr;
  DType wire_dtype_ = FLOAT32;
  std::span<const RowValues> pull_;
  std::vector<PerShard> shards_;
  bool pushes_ = false;
  int64_t push_bytes_ = 0;
  int64_t pull_bytes_ = 0;
};

}  // namespace pst

#endif  // PST_WORKER_CLIENT_ROW_SPLIT_H_
