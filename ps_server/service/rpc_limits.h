// The checks of what one client may make a shard spend (RpcLimits,
// common/server_limits.h). Every RPC of the gRPC service is held to these
// bounds, so that no request, however crafted, and no number of open or
// abandoned calls can crash the PS or grow its memory or threads without
// bound. ps_server sets them from its flags (README, "Limits"). What an
// answer may weigh is the core's (ps_server/core/pull_reply.h).
#ifndef PST_PS_SERVER_SERVICE_RPC_LIMITS_H_
#define PST_PS_SERVER_SERVICE_RPC_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/server_limits.h"
#include "ps.pb.h"

namespace pst {

// The queue threads `limits` asks for (resolving 0).
int ServerThreads(const RpcLimits& limits);
// The memory gRPC may hold for messages in flight: the largest request
// plus the largest answer.
int64_t TransportMemoryBytes(const RpcLimits& limits);

// InvalidArgument for a pull naming more than max_names_per_request
// variables, or one variable twice.
absl::Status CheckPullNames(const PullRequest& request, const RpcLimits& limits);
// InvalidArgument for a pull naming more than max_rows_per_pull embedding
// rows in all, from the sizes of its ids alone.
absl::Status CheckPullRows(const PullRequest& request, const RpcLimits& limits);
// The same for `rows` rows counted elsewhere (ids still in a shared region).
absl::Status CheckPulledRowCount(int64_t rows, const RpcLimits& limits);
// InvalidArgument for a push carrying more than max_names_per_request
// gradients (the shard refuses repeated ones).
absl::Status CheckPushSize(const PushRequest& request, const RpcLimits& limits);

// When a pull's wait for its version ends: `now` plus its timeout_ms (at
// most max_pull_wait), and never past the call's own deadline.
absl::Time PullWaitDeadline(absl::Time now, const PullRequest& request, absl::Time call_deadline,
                            const RpcLimits& limits);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_RPC_LIMITS_H_
