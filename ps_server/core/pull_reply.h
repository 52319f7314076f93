// The size of a pull's answer, bounded before anything is encoded: a
// caller refuses an answer larger than it will send (ps_server sets the
// bound from --max_reply_bytes; shard_calls.h: PullBounds).
#ifndef PST_PS_SERVER_CORE_PULL_REPLY_H_
#define PST_PS_SERVER_CORE_PULL_REPLY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "ps.pb.h"
#include "ps_server/core/variable_store.h"

namespace pst {

class PulledRows;  // ps_server/core/pulled_rows.h

// An upper bound of the serialized size of a PullResponse carrying
// `variables` in `dtype`.
int64_t PullReplyBytes(const std::vector<const Variable*>& variables, DType dtype);
// ResourceExhausted if that is more than `max_reply_bytes` (0: no bound).
absl::Status CheckPullReply(const std::vector<const Variable*>& variables, DType dtype,
                            int64_t max_reply_bytes);
// The same for an answer carrying `variables` and `rows` (the PS encodes
// both), also bounded by what one gRPC message may hold.
absl::Status CheckPullReply(const std::vector<const Variable*>& variables, const PulledRows& rows,
                            DType dtype, int64_t max_reply_bytes);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_PULL_REPLY_H_
