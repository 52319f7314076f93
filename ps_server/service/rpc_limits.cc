#include "ps_server/service/rpc_limits.h"

#include <algorithm>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

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

absl::Status CheckPullRows(const PullRequest& request, const RpcLimits& limits) {
  int64_t rows = 0;
  for (const EmbeddingRows& part : request.rows()) {
    rows += static_cast<int64_t>(part.ids().size() / sizeof(uint64_t));
  }
  return CheckPulledRowCount(rows, limits);
}

absl::Status CheckPulledRowCount(int64_t rows, const RpcLimits& limits) {
  if (rows > limits.max_rows_per_pull) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pull names ", rows, " embedding rows, more than the ", limits.max_rows_per_pull,
        " this PS answers in one call (--max_rows_per_pull); pull them in parts"));
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

absl::Time PullWaitDeadline(absl::Time now, const PullRequest& request, absl::Time call_deadline,
                            const RpcLimits& limits) {
  const absl::Duration asked = absl::Milliseconds(std::max(0, request.timeout_ms()));
  return std::min(now + std::min(asked, limits.max_pull_wait), call_deadline);
}

}  // namespace pst
