// The gRPC face of a ParameterShard: translates calls and statuses, and
// holds every call to the bounds of rpc_limits.h (names per request, the
// wait of a pull, open exchanges and their idle time, memory of unfinished
// pushes). Shutdown is forwarded to a callback so that the process (not
// the service) decides how to stop.
//
// Every method is served on gRPC's completion-queue API by the server's
// fixed set of queue threads (rpc/queue_server.h), so that no call
// holds a thread while it waits and a flood of calls adds none. The data
// plane is one method, Exchange, over raw byte buffers
// (ps_server/service/exchange_call.h, rpc/chunk_wire.h); a long-polling pull, like
// the chief's AwaitWorkersDone, leaves a waiter in the shard. The other
// methods are short and answered on the queue thread, except Checkpoint,
// which runs on a thread of its own, one at a time. Workers on the same
// host may attach a shared region (ShmAttach) and move an exchange's bytes
// through it.
#ifndef PST_PS_SERVER_SERVICE_PS_SERVICE_H_
#define PST_PS_SERVER_SERVICE_PS_SERVICE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/security.h"
#include "common/thread_pool.h"
#include "grpcpp/server.h"
#include "ps.grpc.pb.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/async_service.h"
#include "ps_server/service/chunk_streams.h"
#include "ps_server/service/done_waits.h"
#include "ps_server/service/exchange_call.h"
#include "ps_server/service/message_pool.h"
#include "ps_server/service/open_streams.h"
#include "ps_server/service/replica_pieces.h"
#include "ps_server/service/rpc_limits.h"
#include "ps_server/service/unary_call.h"
#include "ps_server/service/worker_sessions.h"
#include "ps_server/shm/shm_regions.h"
#include "rpc/connection_gate.h"
#include "rpc/queue_server.h"

namespace pst {

// What the process does for the admin RPCs. An empty hook makes its RPC
// answer FAILED_PRECONDITION, saying what is not configured.
struct AdminHooks {
  std::function<void()> shutdown;                             // Shutdown
  std::function<absl::StatusOr<CheckpointResponse>()> checkpoint;  // Checkpoint
  // A worker's Register was refused because this process is a backup: the
  // worker looks for the shard's primary (ShardOffice::PrimarySought).
  std::function<void()> primary_sought;
};

class ParameterServerService final : public AsyncParameterServer {
 public:
  // Threads that send the answers of pulls whose wait is over.
  static constexpr int kAnswerThreads = 8;

  // `server` must outlive the service. `shared_memory` false refuses
  // every ShmAttach (cluster.shm: SHM_OFF). `task_tokens`: the server
  // checks a cluster token, so a call may carry a task token, and one that
  // acts as a worker is checked against it (CheckActsAs); without a token
  // no call can carry one, and nothing is looked up.
  ParameterServerService(pst::ParameterShard* server, AdminHooks hooks,
                         const RpcLimits& limits = {}, bool shared_memory = true,
                         bool task_tokens = false);

  // Exchanges open now, and the bytes their unfinished pushes hold.
  const OpenStreams& open_streams() const { return streams_; }

  // Workers whose tensors travel through shared memory now.
  int shared_regions() const { return shm_regions_.attached(); }
  // Shared-memory exchanges parked for their region (ShmRegions::TryClaim).
  int shared_region_waiters() const { return shm_regions_.waiting(); }

  // What Stats answers: the shard's, and what this service refused.
  void FillStats(StatsResponse* response) const;

  // The gate the server's connections pass (rpc/connection_gate.h), for
  // Stats; set before the server starts.
  void set_connection_gate(std::shared_ptr<ConnectionGate> gate) { gate_ = std::move(gate); }

  // Requests the first call of every method on `queue`; each call
  // requests the next as it arrives.
  void RequestCalls(grpc::ServerCompletionQueue* queue);

 private:
  // The budget of bytes for pushes being reassembled (RpcLimits).
  int64_t PushBufferBudget() const;
  // Gives a reassembly buffer back to the pool, and the memory to the
  // system once the pool has freed enough of them.
  void ReturnPushBuffer(std::unique_ptr<PushRequest> buffer);
  // `bytes` were freed: given back to the system once enough have been.
  void NoteFreed(int64_t bytes);

  template <typename Request, typename Response>
  using Call = UnaryCall<Request, Response>;
  // A method whose handler answers at once on the queue thread.
  template <typename Request, typename Response>
  typename Call<Request, Response>::Method AnswerAtOnce(
      typename Call<Request, Response>::RequestCall request,
      std::function<absl::Status(const Request&, Response*)> handle);
  // The same, for a call that acts as request.worker(): its session must
  // be admitted for that worker first (WorkerSessions).
  template <typename Request, typename Response>
  typename Call<Request, Response>::Method AnswerForWorker(
      typename Call<Request, Response>::RequestCall request,
      std::function<absl::Status(const Request&, Response*)> handle);
  // Writes the checkpoint on checkpoint_thread_; refused while one is written.
  void ServeCheckpoint(Call<CheckpointRequest, CheckpointResponse>* call);
  // An Init is as large as the model, and one that reaches an initialized
  // shard changes nothing: of such a one only the worker is read (a few
  // bytes, whatever its size), on the queue thread; the first ones are
  // parsed and applied on the work threads, so no Init holds a queue
  // thread for its size.
  void ServeInit(Call<grpc::ByteBuffer, grpc::ByteBuffer>* call);
  // Waits as a pull does, holding no thread (DoneWaits): cut to
  // max_pull_wait and the call's deadline, and ended when the caller goes.
  // A call that names a worker is checked as every call acting as one.
  void ServeAwaitWorkersDone(Call<AwaitWorkersDoneRequest, StatsResponse>* call);
  // A primary's update, for the cluster token only, applied on
  // replica_thread_ in the order updates arrive; one in pieces once its
  // last piece is in (each piece before is answered applied). A refusal
  // the primary acts on (ParameterShard::ApplyReplicaUpdate's
  // FailedPrecondition) is answered OK with ReplicaAck.applied false. A
  // version's update is answered as soon as it is checked, while its rows
  // are written (ApplyReplicaUpdate's `acknowledge`).
  void ServeReplicate(Call<ReplicaUpdate, ReplicaAck>* call);

  pst::ParameterShard* server_;
  AdminHooks hooks_;
  const RpcLimits limits_;
  // Reassembled pushes and pull answers, kept so that the next call reuses
  // their buffers (as many as training has at once).
  MessagePool<PushRequest> push_buffers_;
  PullPayloadPool pull_payloads_;
  std::atomic<int64_t> freed_since_trim_{0};
  ShmRegions shm_regions_;
  WorkerSessions sessions_;
  const bool task_tokens_;
  std::shared_ptr<ConnectionGate> gate_;
  std::atomic<bool> checkpointing_{false};  // checkpoint_thread_ is writing one
  // Inits before the shard has its model: the largest that can be its share
  // of the config's model (unset when the workers bring their own), and the
  // bytes of those that arrived and wait to be parsed, at most
  // init_budget_ (one is always let through).
  const std::optional<int64_t> max_init_bytes_;
  // The AwaitWorkersDone calls waiting: each worker's own, and observers'.
  DoneWaits done_waits_;
  const int64_t init_budget_;
  std::atomic<int64_t> init_bytes_waiting_{0};
  // The unary methods, as UnaryCall requests them.
  Call<RegisterRequest, RegisterResponse>::Method register_;
  Call<grpc::ByteBuffer, grpc::ByteBuffer>::Method init_;
  Call<ShmAttachRequest, ShmAttachResponse>::Method shm_attach_;
  Call<HeartbeatRequest, HeartbeatResponse>::Method heartbeat_;
  Call<DoneRequest, DoneResponse>::Method done_;
  Call<StatsRequest, StatsResponse>::Method stats_;
  Call<AwaitWorkersDoneRequest, StatsResponse>::Method await_workers_done_;
  Call<CheckpointRequest, CheckpointResponse>::Method checkpoint_;
  Call<ShutdownRequest, ShutdownResponse>::Method shutdown_;
  Call<ReplicaUpdate, ReplicaAck>::Method replicate_;
  // Its watchdog may end calls until it is destroyed.
  OpenStreams streams_;
  ExchangeResources exchange_;
  // Last, so that they are joined first: a call's last event may run on
  // them after the server has shut down (a task handed off by an event
  // settles the call when it ends), and ending a call gives back its place
  // in streams_, its buffers and its region.
  // Where exchanges hand off what must not run on the queue's threads
  // (ExchangeResources): answers once a waiter is woken, bounded, since a
  // SYNC step wakes every worker's pull at once; and the heavy part of
  // large exchanges, and the calls whose update waited for its turn.
  ThreadPool answer_threads_{kAnswerThreads};
  ThreadPool work_threads_{static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))};
  // Checkpoint writes, one at a time: another asked for meanwhile is
  // refused at once.
  ThreadPool checkpoint_thread_{1};
  // A backup's updates from its primary, one at a time, and the one that
  // arrives in pieces (used on replica_thread_ only).
  ThreadPool replica_thread_{1};
  ReplicaAssembly replica_pieces_;
};

// Largest request a shard accepts unless told otherwise (ps_server
// --max_message_bytes): far above a Push of the models trained here, small
// enough that one bad client cannot make the PS buffer a gigabyte.
inline constexpr int kDefaultMaxRequestBytes = RpcLimits().max_request_bytes;

// A running gRPC server for `server` on `address`, secured by `security`,
// served by `limits.max_server_threads` queue threads; `port` is the bound
// port (useful with port 0). Unavailable if the address cannot be bound.
// gRPC refuses a request larger than `limits.max_request_bytes` with
// RESOURCE_EXHAUSTED before any handler sees it.
struct RunningServer {
  RunningServer() = default;
  RunningServer(RunningServer&&) = default;
  RunningServer& operator=(RunningServer&&) = default;
  // Stops the gate before grpc_server's destructor shuts the server down.
  ~RunningServer() {
    if (gate != nullptr) gate->Stop();
  }

  // Stops taking connections, then shuts the server down
  // (QueueServer::Shutdown). Use it rather than grpc_server->Shutdown:
  // gRPC drops, unclosed, a connection the gate hands it once it is
  // shutting down.
  // A second past `deadline`, the connections still open are shut down
  // (ConnectionGate::ShutDownConnections), so that no client keeps the
  // server from ending.
  void Shutdown(std::chrono::system_clock::time_point deadline =
                    std::chrono::system_clock::time_point::max());

  std::unique_ptr<ParameterServerService> service;
  std::unique_ptr<QueueServer> grpc_server;  // shut down (and so destroyed) before the service
  std::shared_ptr<ConnectionGate> gate;       // accepts the server's connections
  int port = 0;
};
absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& address, pst::ParameterShard* server, AdminHooks hooks,
    const ClusterSecurity& security = ClusterSecurity::Plaintext(),
    const RpcLimits& limits = {}, bool shared_memory = true);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_PS_SERVICE_H_
