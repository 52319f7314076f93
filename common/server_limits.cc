#include "common/server_limits.h"

#include "absl/strings/str_cat.h"

namespace pst {

absl::Status ValidateRpcLimits(const RpcLimits& limits) {
  auto positive = [](const char* flag, int64_t value) {
    return value > 0 ? absl::OkStatus()
                     : absl::InvalidArgumentError(absl::StrCat(
                           "--", flag, " must be positive (it is ", value, ")"));
  };
  for (absl::Status s : {positive("max_message_bytes", limits.max_request_bytes),
                         positive("max_names_per_request", limits.max_names_per_request),
                         positive("max_rows_per_pull", limits.max_rows_per_pull),
                         positive("max_reply_bytes", limits.max_reply_bytes),
                         positive("max_streams", limits.max_streams),
                         positive("max_streams_per_worker", limits.max_streams_per_worker)}) {
    if (!s.ok()) return s;
  }
  if (limits.max_server_threads < 0) {
    return absl::InvalidArgumentError(
        "--max_server_threads must be 0 (automatic) or a positive number of threads");
  }
  if (limits.max_pull_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--max_pull_wait_seconds must be positive");
  }
  if (limits.max_connections < 0) {
    return absl::InvalidArgumentError(
        "--max_connections must be 0 (what the descriptor limit allows) or more");
  }
  if (limits.max_connections_per_source <= 0) {
    return absl::InvalidArgumentError("--max_connections_per_source must be positive");
  }
  if (limits.connection_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--connection_idle_timeout_seconds must be positive");
  }
  if (limits.handshake_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--handshake_timeout_seconds must be positive");
  }
  if (limits.min_push_bytes_per_second < 0) {
    return absl::InvalidArgumentError("--min_push_bytes_per_second must be 0 (no minimum) or more");
  }
  if (limits.stream_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--stream_idle_timeout_seconds must be positive");
  }
  if (limits.max_push_buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        "--max_push_buffer_bytes must be 0 (automatic) or a positive number of bytes");
  }
  return absl::OkStatus();
}

}  // namespace pst
