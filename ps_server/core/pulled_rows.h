// The embedding rows a pull names, as the shard hands them to its caller
// (ParameterShard::PullVisitOrWait).
#ifndef PST_PS_SERVER_CORE_PULLED_ROWS_H_
#define PST_PS_SERVER_CORE_PULLED_ROWS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "ps.pb.h"
#include "ps_server/core/embedding_table.h"

namespace pst {

// The embedding rows a pull names (PullRequest.rows), checked by the shard,
// for its visitor to answer while the shard's lock is held: each row's
// committed values, or its initial value if it was never trained.
class PulledRows {
 public:
  PulledRows(const PullRequest& request, const EmbeddingTable& table)
      : request_(request), table_(table) {}
  bool empty() const { return request_.rows().empty(); }
  // The rows named, over every table (an id named twice counts twice).
  int64_t row_count() const;
  // An upper bound of the bytes the answer adds to a PullResponse: the
  // values in the pull's dtype, the table names and the framing.
  int64_t reply_bytes() const;
  // Appends to response->rows() one EmbeddingRows per table the pull
  // names, in its order: the table, the pull's dtype, and the values of
  // its ids, row after row, in the pull's order (no ids). INTERNAL when a
  // table's disk tier cannot be read.
  absl::Status AnswerTo(PullResponse* response) const;

 private:
  const PullRequest& request_;
  const EmbeddingTable& table_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_PULLED_ROWS_H_
