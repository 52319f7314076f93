// The gRPC face of a ParameterShard: translates calls and statuses, and
// holds every call to the bounds of rpc_limits.h (names per request, reply
// size, the wait of a pull, open streams and their idle time, memory of
// unfinished pushes). Shutdown is forwarded to a callback so that the
// process (not the service) decides how to stop.
//
// PullStream, PushStream and PushPull carry the bulk of the bytes, so they
// are served over raw byte buffers (rpc/chunk_wire.h): the service
// replaces the generated handlers of those methods with its own. Workers on
// the same host may instead attach a shared region (ShmAttach) and move the
// bytes through it (ShmExchange, ps_server/shm_exchange.h).
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

class ParameterServerService final : public ParameterServer::Service {
 public:
  // `server` must outlive the service. `shared_memory` false refuses
  // every ShmAttach (cluster.shm: SHM_OFF).
  ParameterServerService(pst::ParameterShard* server, AdminHooks hooks,
                         const RpcLimits& limits = {}, bool shared_memory = true);

  // Streamed calls open now, and the bytes their unfinished pushes hold.
  const OpenStreams& open_streams() const { return streams_; }

  // Workers whose tensors travel through shared memory now.
  int shared_regions() const { return shm_regions_.attached(); }
  // Shared-memory exchanges waiting for their region (ShmRegions::Claim).
  int shared_region_waiters() const { return shm_regions_.waiting(); }

  // PullStream, PushStream and PushPull, over byte buffers.
  grpc::Status ServePullStream(grpc::ServerContext* context,
                               grpc::ServerReaderWriter<grpc::ByteBuffer, PullRequest>* stream);
  grpc::Status ServePushStream(grpc::ServerContext* context,
                               grpc::ServerReader<grpc::ByteBuffer>* reader,
                               PushResponse* response);
  grpc::Status ServePushPull(grpc::ServerContext* context,
                             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);

  grpc::Status Register(grpc::ServerContext* context, const RegisterRequest* request,
                        RegisterResponse* response) override;
  grpc::Status Init(grpc::ServerContext* context, const InitRequest* request,
                    InitResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const PullRequest* request,
                    PullResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const PushRequest* request,
                    PushResponse* response) override;
  grpc::Status PushPullSmall(grpc::ServerContext* context, const PushPullRequest* request,
                             PushPullResponse* response) override;
  grpc::Status ShmAttach(grpc::ServerContext* context, const ShmAttachRequest* request,
                         ShmAttachResponse* response) override;
  grpc::Status ShmExchange(grpc::ServerContext* context, const ShmExchangeRequest* request,
                           ShmExchangeResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override;
  grpc::Status Done(grpc::ServerContext* context, const DoneRequest* request,
                    DoneResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const StatsRequest* request,
                     StatsResponse* response) override;
  // Parks its thread as a long-polling Pull does: its wait is cut to
  // max_pull_wait and the call's deadline, and ends when the caller goes.
  grpc::Status AwaitWorkersDone(grpc::ServerContext* context,
                                const AwaitWorkersDoneRequest* request,
                                StatsResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const CheckpointRequest* request,
                          CheckpointResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const ShutdownRequest* request,
                        ShutdownResponse* response) override;

 private:
  // The checks a streamed push's header passes before its payload is
  // taken: its size, its worker's streams, the push buffer budget.
  absl::Status AdmitPush(const PushRequest& header, int64_t buffered_bytes,
                         OpenStreams::Stream* stream) const;
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
  // Where PushPull answers are written from (BackgroundWriter).
  ThreadPool threads_;
  // Last: its watchdog may end calls until it is destroyed.
  OpenStreams streams_;
};

// Largest request a shard accepts unless told otherwise (ps_server
// --max_message_bytes): far above a Push of the models trained here, small
// enough that one bad client cannot make the PS buffer a gigabyte.
inline constexpr int kDefaultMaxRequestBytes = RpcLimits().max_request_bytes;

// A running gRPC server for `server` on `address`, secured by `security`;
// the bound port is written to `*bound_port` (useful with port 0).
// Unavailable if the address cannot be bound. gRPC refuses a request larger
// than `limits.max_request_bytes` with RESOURCE_EXHAUSTED before any
// handler sees it, and a call that finds all `limits.max_server_threads`
// threads busy with RESOURCE_EXHAUSTED too.
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
