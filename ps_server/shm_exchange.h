// The server's end of ShmExchange (proto/ps.proto): a Push, a Pull or a
// PushPull whose tensor bytes lie in a worker's shared region.
#ifndef PST_PS_SERVER_SHM_EXCHANGE_H_
#define PST_PS_SERVER_SHM_EXCHANGE_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/shared_memory.h"
#include "ps.pb.h"
#include "ps_server/chunk_streams.h"
#include "ps_server/parameter_shard.h"
#include "ps_server/rpc_limits.h"

namespace pst {

struct ShmExchangeContext {
  ParameterShard* shard;
  const RpcLimits* limits;
  // The push's gradients are read into it (its buffers reused from an
  // earlier call).
  PushRequest* buffer;
  PullPayloadPool* payloads;  // where 16-bit answers are encoded
  // When the pull's wait ends, given its request.
  std::function<absl::Time(const PullRequest&)> pull_deadline;
  std::function<bool()> caller_gone;
};

struct ShmExchangeBytes {
  int64_t pushed = 0;    // read from the region
  int64_t answered = 0;  // written to it
};

// Serves `request` over `region`, the worker's. The push's bytes are copied
// out of the region into the shard's own buffer and checked there, as bytes
// from a socket are, before anything is applied: what the worker writes to
// the region afterwards changes nothing. Every range is checked against the
// region before it is touched, the answer's before the push is applied.
// The pull then runs as PushPull's (the pushed variables, at a version
// that includes the push) or as a Pull (no push), and its values are
// written into the region at answer_offset; `response` gets its header.
absl::Status ServeShmExchange(const ShmExchangeRequest& request, const OpenedRegion& region,
                              const ShmExchangeContext& context, ShmExchangeResponse* response,
                              ShmExchangeBytes* bytes);

}  // namespace pst

#endif  // PST_PS_SERVER_SHM_EXCHANGE_H_
