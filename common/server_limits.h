// The bounds a PS holds each client to (what one client may make a shard
// spend), set from ps_server's limit flags (common/overrides.h). The checks
// that enforce them are in ps_server/service/rpc_limits.h.
//
// The defaults are sized for a 2-core machine with about 1.5 GB for the
// PS, and sit well above what training needs: a worker has one exchange
// and a few short unary calls (heartbeat, AwaitWorkersDone) open per shard
// at a time.
#ifndef PST_COMMON_SERVER_LIMITS_H_
#define PST_COMMON_SERVER_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pst {

struct RpcLimits {
  // Largest request, in bytes; gRPC refuses a larger one with
  // RESOURCE_EXHAUSTED before any handler sees it. Far above a Push of the
  // models trained here; an Init carries a shard's whole share.
  int max_request_bytes = 256 << 20;
  // Variables one exchange's pull may name, or its push carry.
  // Names must be distinct as well, so an answer is never larger than the
  // shard's share.
  int max_names_per_request = 65536;
  // Embedding rows one pull may name, over all its tables: checked from the
  // request's sizes before any row is looked at, so that one call's work
  // under the shard's lock stays small (a million ids cost tens of
  // milliseconds). A worker pieces a larger pull (RegisterResponse).
  int max_rows_per_pull = 1 << 20;
  // Largest answer the PS encodes into a buffer of its own (an exchange's
  // pull in a 16-bit wire type, and the embedding rows a pull names, in any
  // wire type), computed before anything is encoded. A float32 answer of
  // dense variables is sent from the variables' own buffers and is bounded
  // by the shard's share alone.
  int64_t max_reply_bytes = 256 << 20;
  // A pull's (and an AwaitWorkersDone's) timeout_ms is cut to this.
  absl::Duration max_pull_wait = absl::Minutes(10);
  // Exchanges open at once (long-polling pulls included): in total, and
  // naming one worker.
  int max_streams = 64;
  int max_streams_per_worker = 4;
  // An exchange that waits this long on its client (for the next message,
  // or for it to read the last one) ends with DEADLINE_EXCEEDED, and what
  // it held is freed.
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  // A push being received that holds some of the push buffer budget must
  // bring at least this many bytes per second, over each stream_idle_timeout
  // in turn, or its exchange ends (DEADLINE_EXCEEDED) and gives the budget
  // back: a client that drips a few bytes now and then is never idle, but
  // holds the budget no longer than one such window. Far below any link a
  // worker pushes over. 0: no minimum.
  int64_t min_push_bytes_per_second = 1 << 20;
  // Bytes held, in total, by pushes being reassembled (every SYNC push,
  // and an ASYNC one that cannot stream into the update). 0: one
  // share per worker plus one (as much as SYNC's aggregation holds anyway).
  // A push that would go past it is refused with RESOURCE_EXHAUSTED, unless
  // no other push holds any.
  int64_t max_push_buffer_bytes = 0;
  // TCP connections the PS holds open at once, checked as each is
  // accepted, before TLS or a token (rpc/connection_gate.h): in total (0:
  // what the descriptor limit leaves beside a reserve for the PS's own
  // files, raised to the hard limit first), one more waiting in the
  // listener's backlog until one closes; and from one source address, one
  // more reset at once and counted. Idle connections cost a descriptor
  // each, and a PS out of descriptors cannot write its checkpoints.
  int max_connections = 0;
  int max_connections_per_source = 128;
  // An accepted connection that has not finished its TLS handshake and
  // sent its HTTP/2 settings within this is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // A connection with no call open for this long is closed (the client
  // connects again at its next call): idle connections do not hold the
  // connection caps for good.
  absl::Duration connection_idle_timeout = absl::Seconds(60);
  // Threads that serve the gRPC calls (the server's completion-queue
  // threads, rpc/queue_server.h). No call holds one while it waits,
  // so these are all the threads calls get, however many are open; the
  // heavy part of a large exchange runs on a pool of one thread per core.
  // 0: automatic (one: with more, gRPC wakes another on every event to
  // poll while the first runs it, which costs a small exchange more than
  // it saves; docs/architecture.md).
  int max_server_threads = 0;
};

// InvalidArgument unless `limits` is usable: every bound positive (the push
// budget may be 0, automatic).
absl::Status ValidateRpcLimits(const RpcLimits& limits);

}  // namespace pst

#endif  // PST_COMMON_SERVER_LIMITS_H_
