// One Exchange call (proto/ps.proto), served on gRPC's completion-queue
// API (rpc/completion_tag.h): a call that reads the request a message at a
// time, pushes it to the shard (ps_server/service/chunk_streams.h: PushIntake), and
// answers the pull as messages (or through the worker's shared region,
// ps_server/service/shm_exchange.h). Its phases and their transitions are in
// exchange_phase.h; its gRPC side (operations, end, waiters, when it is
// freed) is exchange_rpc.h's; TCP and the shared region are two paths
// behind exchange_path.h.
//
// No thread is held while the call waits. A pull that must wait for its
// version leaves a waiter in the shard (ParameterShard::PullVisitOrWait)
// and its answer is sent from a pool task once the waiter is woken; a push
// that must wait for its turn, or a shared region still claimed by the
// worker's previous exchange, leaves a waiter too and goes on on the work
// pool once woken; everything else runs on the completion queue's threads,
// each event bounded by one message's work. A cancelled call drops its
// waiter; the idle watchdog (ps_server/service/open_streams.h) ends a call that
// waits on its client.
#ifndef PST_PS_SERVER_SERVICE_EXCHANGE_CALL_H_
#define PST_PS_SERVER_SERVICE_EXCHANGE_CALL_H_

#include <functional>
#include <memory>

#include "common/thread_pool.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/byte_buffer.h"
#include "ps.pb.h"
#include "ps_server/service/async_service.h"
#include "ps_server/service/chunk_streams.h"
#include "ps_server/service/message_pool.h"
#include "ps_server/service/open_streams.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/rpc_limits.h"
#include "ps_server/shm/shm_regions.h"
#include "ps_server/service/worker_sessions.h"

namespace pst {

// What every exchange of a service shares; it all outlives the calls
// (ParameterServerService owns it, and gRPC's server is shut down first).
struct ExchangeResources {
  AsyncParameterServer* service;  // where calls are requested
  ParameterShard* shard;
  const RpcLimits* limits;
  OpenStreams* streams;
  ShmRegions* regions;
  WorkerSessions* sessions;
  // Whether calls may carry task tokens (the server checks a token).
  bool task_tokens;
  PullPayloadPool* payloads;
  // Where pushes are reassembled; a buffer is taken per call and given back.
  std::function<std::unique_ptr<PushRequest>()> take_push_buffer;
  std::function<void(std::unique_ptr<PushRequest>)> return_push_buffer;
  // Told of the bytes of rows a call freed as it ended (a request or an
  // answer of at least kLargeRowBytes), so that they go back to the system
  // instead of staying in the heap warm.
  std::function<void(int64_t bytes)> large_rows_freed;
  // Where a pull's answer is sent from once its waiter is woken: short
  // tasks that never block.
  ThreadPool* answers;
  // Where the messages of exchanges with a large shard are taken (see
  // exchange_rpc.cc), and where waits go on once woken: as many threads as
  // cores.
  ThreadPool* work;
};

// Rows a call holds (ids and data, asked or answered) from which they are
// freed as it ends rather than kept for reuse: far more than a training
// step's rows, which the next step's buffers reuse.
inline constexpr int64_t kLargeRowBytes = 8 << 20;

// Requests the next Exchange call on `queue`. The call serves itself, on
// the queue's threads, and requests the one after it as it arrives; it is
// freed once done. A request the server's shutdown ends frees itself.
void AwaitExchange(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_EXCHANGE_CALL_H_
