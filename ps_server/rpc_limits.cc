#include "ps_server/rpc_limits.h"

#include <algorithm>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "ps_server/parameter_shard.h"

namespace pst {

int64_t TransportMemoryBytes(const RpcLimits& limits) {
  return int64_t{limits.max_request_bytes} + limits.max_reply_bytes;
}

int ServerThreads(const RpcLimits& limits) {
  if (limits.max_server_threads > 0) return limits.max_server_threads;
  return 1;
}

absl::Status CheckPullNames(const PullRequest& request, const RpcLimits& limits) {
  if (request.names_size() > limits.max_names_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pull names ", request.names_size(), " variables, more than the ",
        limits.max_names_per_request, " this PS takes in one request (--max_names_per_request)"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(request.names_size());
  for (const std::string& name : request.names()) {
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("a pull names variable \"", name, "\" twice; name each variable once"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPushSize(const PushRequest& request, const RpcLimits& limits) {
  if (request.gradients_size() > limits.max_names_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a push carries ", request.gradients_size(), " gradients, more than the ",
        limits.max_names_per_request, " this PS takes in one request (--max_names_per_request)"));
  }
  return absl::OkStatus();
}

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

absl::Time PullWaitDeadline(absl::Time now, const PullRequest& request, absl::Time call_deadline,
                            const RpcLimits& limits) {
  const absl::Duration asked = absl::Milliseconds(std::max(0, request.timeout_ms()));
  return std::min(now + std::min(asked, limits.max_pull_wait), call_deadline);
}

}  // namespace pst
