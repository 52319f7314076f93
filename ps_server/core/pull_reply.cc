#include "ps_server/core/pull_reply.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "ps_server/core/pulled_rows.h"

namespace pst {

int64_t PullReplyBytes(const std::vector<const Variable*>& variables, DType dtype) {
  const int64_t element_bytes = std::max(DTypeBytes(dtype), 1);
  // Per tensor: the payload, the name, each dimension as a varint (at most
  // 10 bytes), and tags, lengths and the dtype (at most 40 bytes).
  int64_t bytes = 16;  // the version
  for (const Variable* v : variables) {
    bytes += static_cast<int64_t>(v->size()) * element_bytes +
             static_cast<int64_t>(v->name.size()) + 10 * static_cast<int64_t>(v->shape.size()) +
             40;
  }
  return bytes;
}

absl::Status CheckPullReply(const std::vector<const Variable*>& variables, DType dtype,
                            int64_t max_reply_bytes) {
  if (max_reply_bytes <= 0) return absl::OkStatus();
  const int64_t bytes = PullReplyBytes(variables, dtype);
  if (bytes <= max_reply_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the answer to this call (", variables.size(), " variables, about ", bytes,
      " bytes) is larger than the ", max_reply_bytes,
      " bytes this PS encodes for one answer (--max_reply_bytes); pull fewer variables per "
      "call, or pull them as FLOAT32, which is sent from the variables' own buffers"));
}

absl::Status CheckPullReply(const std::vector<const Variable*>& variables, const PulledRows& rows,
                            DType dtype, int64_t max_reply_bytes) {
  if (rows.empty()) return CheckPullReply(variables, dtype, max_reply_bytes);
  if (max_reply_bytes <= 0) return absl::OkStatus();
  const int64_t bytes = PullReplyBytes(variables, dtype) + rows.reply_bytes();
  if (bytes <= max_reply_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the answer to this call (", variables.size(), " variables and ", rows.row_count(),
      " embedding rows, about ", bytes, " bytes) is larger than the ", max_reply_bytes,
      " bytes this PS encodes for one answer (--max_reply_bytes); pull fewer rows per call"));
}

}  // namespace pst
