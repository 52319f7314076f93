// The gRPC face of a ParameterShard: translates calls and statuses, and
// holds every call to the bounds of rpc_limits.h (names per request, the
// wait of a pull, open exchanges and their idle time, memory of unfinished
// pushes). Shutdown is forwarded to a callback so that the process (not
// the service) decides how to stop.
//
// The data plane is one method, Exchange, served on gRPC's callback API
// over raw byte buffers (ps_server/exchange_call.h, rpc/chunk_wire.h), so
// that a long-polling pull holds no thread. AwaitWorkersDone, the other
// long-poll, is a callback method too. The remaining methods are short
// unary calls of the sync API. Workers on the same host may attach a
// shared region (ShmAttach) and move an exchange's bytes through it.
#ifndef PST_PS_SERVER_PS_SERVICE_H_
#define PST_PS_SERVER_PS_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/security.h"
#include "common/thread_pool.h"
#include "grpcpp/server.h"
#include "ps.grpc.pb.h"
#include "ps_server/chunk_streams.h"
#include "ps_server/exchange_call.h"
#include "ps_server/message_pool.h"
#include "ps_server/open_streams.h"
#include "ps_server/parameter_shard.h"
#include "ps_server/rpc_limits.h"
#include "ps_server/shm_regions.h"

namespace pst {

// What the process does for the admin RPCs. An empty hook makes its RPC
// answer FAILED_PRECONDITION, saying what is not configured.
struct AdminHooks {
  std::function<void()> shutdown;                             // Shutdown
  std::function<absl::StatusOr<CheckpointResponse>()> checkpoint;  // Checkpoint
};

// Exchange (raw, callback) and AwaitWorkersDone (callback) beside the
// sync API's unary methods, on one service.
using ParameterServerBase = ParameterServer::WithRawCallbackMethod_Exchange<
    ParameterServer::WithCallbackMethod_AwaitWorkersDone<ParameterServer::Service>>;

class ParameterServerService final : public ParameterServerBase {
 public:
  // Threads that send the answers of pulls whose wait is over.
  static constexpr int kAnswerThreads = 8;

  // `server` must outlive the service. `shared_memory` false refuses
  // every ShmAttach (cluster.shm: SHM_OFF).
  ParameterServerService(pst::ParameterShard* server, AdminHooks hooks,
                         const RpcLimits& limits = {}, bool shared_memory = true);

  // Exchanges open now, and the bytes their unfinished pushes hold.
  const OpenStreams& open_streams() const { return streams_; }

  // Workers whose tensors travel through shared memory now.
  int shared_regions() const { return shm_regions_.attached(); }
  // Shared-memory exchanges waiting for their region (ShmRegions::Claim).
  int shared_region_waiters() const { return shm_regions_.waiting(); }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* context) override;
  // Waits as a pull does, holding no thread: cut to max_pull_wait and the
  // call's deadline, and ended when the caller goes.
  grpc::ServerUnaryReactor* AwaitWorkersDone(grpc::CallbackServerContext* context,
                                             const AwaitWorkersDoneRequest* request,
                                             StatsResponse* response) override;

  grpc::Status Register(grpc::ServerContext* context, const RegisterRequest* request,
                        RegisterResponse* response) override;
  grpc::Status Init(grpc::ServerContext* context, const InitRequest* request,
                    InitResponse* response) override;
  grpc::Status ShmAttach(grpc::ServerContext* context, const ShmAttachRequest* request,
                         ShmAttachResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override;
  grpc::Status Done(grpc::ServerContext* context, const DoneRequest* request,
                    DoneResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const StatsRequest* request,
                     StatsResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const CheckpointRequest* request,
                          CheckpointResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const ShutdownRequest* request,
                        ShutdownResponse* response) override;

 private:
  // The budget of bytes for pushes being reassembled (RpcLimits).
  int64_t PushBufferBudget() const;
  // Gives a reassembly buffer back to the pool, and the memory to the
  // system once the pool has freed enough of them.
  void ReturnPushBuffer(std::unique_ptr<PushRequest> buffer);

  pst::ParameterShard* server_;
  AdminHooks hooks_;
  const RpcLimits limits_;
  // Reassembled pushes and pull answers, kept so that the next call reuses
  // their buffers (as many as training has at once).
  MessagePool<PushRequest> push_buffers_;
  PullPayloadPool pull_payloads_;
  std::atomic<int64_t> freed_since_trim_{0};
  ShmRegions shm_regions_;
  // Where exchanges hand off what must not run in gRPC's callbacks
  // (ExchangeResources): answers once a waiter is woken, bounded, since a
  // SYNC step wakes every worker's pull at once; and what may block.
  ThreadPool answer_threads_{kAnswerThreads};
  ThreadPool blocking_threads_;
  // Last: its watchdog may end calls until it is destroyed.
  OpenStreams streams_;
  ExchangeResources exchange_;
};

// Largest request a shard accepts unless told otherwise (ps_server
// --max_message_bytes): far above a Push of the models trained here, small
// enough that one bad client cannot make the PS buffer a gigabyte.
inline constexpr int kDefaultMaxRequestBytes = RpcLimits().max_request_bytes;

// A running gRPC server for `server` on `address`, secured by `security`;
// the bound port is written to `*bound_port` (useful with port 0).
// Unavailable if the address cannot be bound. gRPC refuses a request larger
// than `limits.max_request_bytes` with RESOURCE_EXHAUSTED before any
// handler sees it, and a unary call that finds all
// `limits.max_server_threads` threads busy with RESOURCE_EXHAUSTED too.
struct RunningServer {
  std::unique_ptr<ParameterServerService> service;
  std::unique_ptr<grpc::Server> grpc_server;
  int port = 0;
};
absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& address, pst::ParameterShard* server, AdminHooks hooks,
    const ClusterSecurity& security = ClusterSecurity::Plaintext(),
    const RpcLimits& limits = {}, bool shared_memory = true);

}  // namespace pst

#endif  // PST_PS_SERVER_PS_SERVICE_H_
