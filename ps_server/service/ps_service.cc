#include "ps_server/service/ps_service.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "common/transient_refusal.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "ps_server/core/model_share.h"
#include "ps_server/core/shard_requests.h"
#include "ps_server/service/chunk_streams.h"
#include "ps_server/service/ps_metrics.h"
#include "rpc/connection_gate.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_status.h"
#include "rpc/peek_field.h"
#include "rpc/worker_session.h"
#include "spdlog/spdlog.h"

namespace pst {

namespace {

// Heap freed by dropped buffers before it is given back to the system.
constexpr int64_t kTrimAfterFreeing = 16 << 20;

// Calls one connection may have open at once (HTTP/2's recommended least).
constexpr int kMaxCallsPerConnection = 100;

// Bytes of payload a reassembly buffer holds.
int64_t BufferBytes(const PushRequest& buffer) {
  int64_t bytes = 0;
  for (const Tensor& gradient : buffer.gradients()) {
    bytes += static_cast<int64_t>(gradient.data().capacity());
  }
  return bytes;
}

}  // namespace

ParameterServerService::ParameterServerService(pst::ParameterShard* server, AdminHooks hooks,
                                               const RpcLimits& limits, bool shared_memory,
                                               bool task_tokens)
    : server_(server),
      hooks_(std::move(hooks)),
      limits_(limits),
      // One buffer per worker, and one for a worker whose old call is
      // still ending: more are freed after use.
      push_buffers_(static_cast<size_t>(server->num_workers()) + 1),
      pull_payloads_(static_cast<size_t>(server->num_workers()) + 1),
      // A region holds a push and its answer.
      shm_regions_(shared_memory, server->num_workers(),
                   int64_t{limits.max_request_bytes} + limits.max_reply_bytes),
      sessions_(server->num_workers(), [server](int worker) { return server->WorkerLive(worker); }),
      task_tokens_(task_tokens),
      max_init_bytes_(server->model_share() ? std::optional(MaxShareInitBytes(*server->model_share()))
                                            : std::nullopt),
      done_waits_(server, &answer_threads_, limits.max_streams),
      // Every worker's Init at once, as a job starts; a share of unknown
      // size (the workers bring their model) gets a request's worth.
      init_budget_(max_init_bytes_ ? std::max<int64_t>(limits.max_request_bytes,
                                                       (server->num_workers() + 1) * *max_init_bytes_)
                                   : limits.max_request_bytes),
      streams_(limits, [this] { return PushBufferBudget(); }),
      exchange_{
          .service = this,
          .shard = server,
          .limits = &limits_,
          .streams = &streams_,
          .regions = &shm_regions_,
          .sessions = &sessions_,
          .task_tokens = task_tokens,
          .payloads = &pull_payloads_,
          .take_push_buffer = [this] { return push_buffers_.Take(); },
          .return_push_buffer =
              [this](std::unique_ptr<PushRequest> buffer) { ReturnPushBuffer(std::move(buffer)); },
          .large_rows_freed = [this](int64_t bytes) { NoteFreed(bytes); },
          .answers = &answer_threads_,
          .work = &work_threads_,
      } {
  using Service = ParameterServerService;
  register_ = AnswerForWorker<RegisterRequest, RegisterResponse>(
      &Service::RequestRegister, [this](const auto& request, auto* response) {
        response->set_max_request_bytes(limits_.max_request_bytes);
        response->set_max_reply_bytes(limits_.max_reply_bytes);
        response->set_max_rows_per_pull(limits_.max_rows_per_pull);
        absl::Status status = server_->Register(request, response);
        if (hooks_.primary_sought && MarkedTransient(status) == TransientRefusal::kNotPrimary) {
          hooks_.primary_sought();
        }
        return status;
      });
  init_ = {.service = this,
           .request = &Service::RequestInit,
           .serve = [this](Call<grpc::ByteBuffer, grpc::ByteBuffer>* call) { ServeInit(call); }};
  shm_attach_ = AnswerForWorker<ShmAttachRequest, ShmAttachResponse>(
      &Service::RequestShmAttach, [this](const auto& request, auto* response) {
        return shm_regions_.Attach(request, response);
      });
  heartbeat_ = AnswerForWorker<HeartbeatRequest, HeartbeatResponse>(
      &Service::RequestHeartbeat, [this](const auto& request, auto* response) {
        return server_->Heartbeat(request, response);
      });
  done_ = AnswerForWorker<DoneRequest, DoneResponse>(
      &Service::RequestDone,
      [this](const auto& request, auto* response) { return server_->Done(request, response); });
  stats_ = AnswerAtOnce<StatsRequest, StatsResponse>(
      &Service::RequestStats, [this](const StatsRequest&, StatsResponse* response) {
        FillStats(response);
        return absl::OkStatus();
      });
  shutdown_ = {.service = this,
               .request = &Service::RequestShutdown,
               .serve = [this](Call<ShutdownRequest, ShutdownResponse>* call) {
                 absl::Status status = CheckClusterToken(*call->context(), "shut the PS down");
                 if (status.ok() && !hooks_.shutdown) {
                   status = absl::FailedPreconditionError("this PS cannot be shut down remotely");
                 }
                 if (status.ok()) hooks_.shutdown();
                 call->Finish(ToGrpcStatus(status));
               }};
  await_workers_done_ = {.service = this,
                         .request = &Service::RequestAwaitWorkersDone,
                         .serve = [this](Call<AwaitWorkersDoneRequest, StatsResponse>* call) {
                           ServeAwaitWorkersDone(call);
                         },
                         .cancellable = true};
  checkpoint_ = {.service = this,
                 .request = &Service::RequestCheckpoint,
                 .serve = [this](Call<CheckpointRequest, CheckpointResponse>* call) {
                   ServeCheckpoint(call);
                 }};
  replicate_ = {.service = this,
                .request = &Service::RequestReplicate,
                .serve = [this](Call<ReplicaUpdate, ReplicaAck>* call) { ServeReplicate(call); }};
}

template <typename Request, typename Response>
typename UnaryCall<Request, Response>::Method ParameterServerService::AnswerAtOnce(
    typename Call<Request, Response>::RequestCall request,
    std::function<absl::Status(const Request&, Response*)> handle) {
  return {.service = this,
          .request = request,
          .serve = [handle = std::move(handle)](Call<Request, Response>* call) {
            call->Finish(ToGrpcStatus(handle(call->request(), call->response())));
          }};
}

void ParameterServerService::FillStats(StatsResponse* response) const {
  server_->Stats(response);
  response->set_exchanges_refused(streams_.refused());
  response->set_sessions_refused(sessions_.refused());
  response->set_region_handoffs_refused(shm_regions_.handoffs_refused());
  if (gate_ != nullptr) {
    response->set_connections_open(gate_->open_connections());
    response->set_connections_refused(gate_->refused_over_source());
    response->set_connections_waited(gate_->refused_over_total());
    response->set_descriptor_shortages(gate_->descriptor_shortages());
  }
}

template <typename Request, typename Response>
typename UnaryCall<Request, Response>::Method ParameterServerService::AnswerForWorker(
    typename Call<Request, Response>::RequestCall request,
    std::function<absl::Status(const Request&, Response*)> handle) {
  return {.service = this,
          .request = request,
          .serve = [this, handle = std::move(handle)](Call<Request, Response>* call) {
            absl::Status status = task_tokens_
                                      ? CheckActsAs(*call->context(), call->request().worker())
                                      : absl::OkStatus();
            if (status.ok()) {
              status = sessions_.Admit(call->request().worker(), SessionOf(*call->context()));
            }
            if (status.ok()) status = handle(call->request(), call->response());
            call->Finish(ToGrpcStatus(status));
          }};
}

void ParameterServerService::RequestCalls(grpc::ServerCompletionQueue* queue) {
  AwaitExchange(exchange_, queue);
  Call<RegisterRequest, RegisterResponse>::Await(&register_, queue);
  Call<grpc::ByteBuffer, grpc::ByteBuffer>::Await(&init_, queue);
  Call<ShmAttachRequest, ShmAttachResponse>::Await(&shm_attach_, queue);
  Call<HeartbeatRequest, HeartbeatResponse>::Await(&heartbeat_, queue);
  Call<DoneRequest, DoneResponse>::Await(&done_, queue);
  Call<StatsRequest, StatsResponse>::Await(&stats_, queue);
  Call<AwaitWorkersDoneRequest, StatsResponse>::Await(&await_workers_done_, queue);
  Call<CheckpointRequest, CheckpointResponse>::Await(&checkpoint_, queue);
  Call<ShutdownRequest, ShutdownResponse>::Await(&shutdown_, queue);
  Call<ReplicaUpdate, ReplicaAck>::Await(&replicate_, queue);
}

void ParameterServerService::ServeInit(Call<grpc::ByteBuffer, grpc::ByteBuffer>* call) {
  auto answer = [call](absl::Status status, const InitResponse& response) {
    if (status.ok()) {
      bool own_buffer = false;
      grpc::Status serialized = grpc::SerializationTraits<InitResponse>::Serialize(
          response, call->response(), &own_buffer);
      status = FromGrpcStatus(serialized);
    }
    call->Finish(ToGrpcStatus(status));
  };
  absl::StatusOr<int32_t> worker = PeekInt32Field(call->request(), InitRequest::kWorkerFieldNumber);
  absl::Status status = worker.status();
  if (status.ok() && task_tokens_) status = CheckActsAs(*call->context(), *worker);
  if (status.ok()) status = sessions_.Admit(*worker, SessionOf(*call->context()));
  if (!status.ok()) return answer(status, {});
  if (server_->initialized()) {
    // The shard keeps what it has whatever this Init carries: its
    // variables are never parsed.
    InitRequest header;
    header.set_worker(*worker);
    InitResponse response;
    status = server_->Init(header, &response);
    return answer(status, response);
  }
  // Each Init waiting here holds its bytes: a flood of large ones, refused
  // only once parsed, grew the PS past its memory (8 of 250 MB: 1.7 GB).
  const int64_t bytes = static_cast<int64_t>(call->request().Length());
  if (max_init_bytes_ && bytes > *max_init_bytes_) {
    return answer(absl::InvalidArgumentError(absl::StrCat(
                      "an Init of ", bytes, " bytes cannot be this shard's share of the config's "
                      "model (training.model), which takes at most ", *max_init_bytes_,
                      " bytes; it was not parsed")),
                  {});
  }
  if (const int64_t waiting = init_bytes_waiting_.fetch_add(bytes);
      waiting > 0 && waiting + bytes > init_budget_) {
    init_bytes_waiting_.fetch_sub(bytes);
    return answer(absl::UnavailableError(absl::StrCat(
                      "Inits of ", waiting, " bytes wait to be checked, the most this PS holds (",
                      init_budget_, "); try again")),
                  {});
  }
  work_threads_.Post([this, call, answer, bytes] {
    InitRequest request;
    InitResponse response;
    grpc::ByteBuffer message = call->request();  // shares the bytes; parsing empties it
    grpc::Status parsed = grpc::SerializationTraits<InitRequest>::Deserialize(&message, &request);
    absl::Status status =
        parsed.ok() ? server_->Init(request, &response)
                    : absl::InvalidArgumentError(absl::StrCat(
                          "the Init request is not a valid InitRequest: ", parsed.error_message()));
    init_bytes_waiting_.fetch_sub(bytes);
    answer(status, response);
  });
}

void ParameterServerService::ServeAwaitWorkersDone(
    Call<AwaitWorkersDoneRequest, StatsResponse>* call) {
  std::optional<int> worker;
  if (call->request().has_worker()) {
    worker = call->request().worker();
    absl::Status status = CheckWorkerIndex(*worker, server_->num_workers());
    if (status.ok() && task_tokens_) status = CheckActsAs(*call->context(), *worker);
    if (status.ok()) status = sessions_.Admit(*worker, SessionOf(*call->context()));
    if (!status.ok()) {
      call->Finish(ToGrpcStatus(status));
      return;
    }
  }
  const absl::Duration asked = absl::Milliseconds(std::max(0, call->request().timeout_ms()));
  const absl::Time deadline = std::min(absl::Now() + std::min(asked, limits_.max_pull_wait),
                                       absl::FromChrono(call->context()->deadline()));
  done_waits_.Serve(call, worker, deadline);
}

void ParameterServerService::ServeCheckpoint(Call<CheckpointRequest, CheckpointResponse>* call) {
  if (absl::Status s = CheckClusterToken(*call->context(), "write a checkpoint"); !s.ok()) {
    call->Finish(ToGrpcStatus(s));
    return;
  }
  if (!hooks_.checkpoint) {
    call->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                              "this PS has no checkpoint directory (training.checkpoint.dir)"));
    return;
  }
  if (checkpointing_.exchange(true)) {
    call->Finish(ToGrpcStatus(MarkTransient(
        absl::ResourceExhaustedError(
            "a checkpoint is being written already; ask again once it is done"),
        TransientRefusal::kOverloaded)));
    return;
  }
  // Writing may take long: never on a queue thread.
  checkpoint_thread_.Post([this, call] {
    absl::StatusOr<CheckpointResponse> written = hooks_.checkpoint();
    checkpointing_.store(false);
    if (written.ok()) *call->response() = *std::move(written);
    call->Finish(ToGrpcStatus(written.status()));
  });
}

void ParameterServerService::ServeReplicate(Call<ReplicaUpdate, ReplicaAck>* call) {
  if (absl::Status s = CheckClusterToken(*call->context(), "replicate a shard"); !s.ok()) {
    call->Finish(ToGrpcStatus(s));
    return;
  }
  // Applying copies a version's rows (or the state whole): never on a
  // queue thread.
  replica_thread_.Post([this, call] {
    // The answer may go before the update is applied, and the call (its
    // request with it) is freed once the answer is out.
    const ReplicaUpdate request = call->TakeRequest();
    const ReplicaUpdate* update = &request;
    std::optional<ReplicaUpdate> assembled;
    if (update->has_piece()) {
      absl::StatusOr<std::optional<ReplicaUpdate>> taken = replica_pieces_.Take(*update);
      if (!taken.ok()) {
        call->Finish(ToGrpcStatus(taken.status()));
        return;
      }
      if (!taken->has_value()) {
        // Taken; the update's answer comes with its last piece.
        call->response()->set_version(server_->version());
        call->response()->set_epoch(server_->epoch());
        call->response()->set_applied(true);
        call->Finish(grpc::Status::OK);
        return;
      }
      assembled = std::move(*taken);
      update = &*assembled;
    }
    ReplicaAck ack;
    bool answered = false;
    absl::Status applied = server_->ApplyReplicaUpdate(*update, &ack, [&] {
      *call->response() = ack;
      call->Finish(grpc::Status::OK);
      answered = true;
    });
    if (answered) {
      if (!applied.ok()) {
        spdlog::error(
            "shard {}: version {} was acknowledged and then could not be applied ({}); this "
            "replica holds no state until the primary sends it whole",
            server_->shard(), update->state().version(), std::string(applied.message()));
      }
      return;
    }
    if (applied.code() == absl::StatusCode::kFailedPrecondition) {
      spdlog::info("shard {}: {}", server_->shard(), std::string(applied.message()));
      applied = absl::OkStatus();
    }
    *call->response() = ack;
    call->Finish(ToGrpcStatus(applied));
  });
}

int64_t ParameterServerService::PushBufferBudget() const {
  if (limits_.max_push_buffer_bytes > 0) return limits_.max_push_buffer_bytes;
  return (static_cast<int64_t>(server_->num_workers()) + 1) * server_->parameter_bytes();
}

void ParameterServerService::ReturnPushBuffer(std::unique_ptr<PushRequest> buffer) {
  const int64_t bytes = BufferBytes(*buffer);
  if (push_buffers_.Give(std::move(buffer))) return;
  NoteFreed(bytes);
}

void ParameterServerService::NoteFreed(int64_t bytes) {
  if (freed_since_trim_.fetch_add(bytes) + bytes >= kTrimAfterFreeing) {
    freed_since_trim_.store(0);
    ReturnFreedMemory();
  }
}

void RunningServer::Shutdown(std::chrono::system_clock::time_point deadline) {
  if (gate != nullptr) gate->Stop();
  if (grpc_server == nullptr) return;
  if (gate == nullptr || deadline == std::chrono::system_clock::time_point::max()) {
    grpc_server->Shutdown(deadline);
    return;
  }
  absl::Notification ended;
  std::thread cutter([&] {
    if (!ended.WaitForNotificationWithDeadline(absl::FromChrono(deadline) + absl::Seconds(1))) {
      gate->ShutDownConnections();
    }
  });
  grpc_server->Shutdown(deadline);
  ended.Notify();
  cutter.join();
}

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& address,
                                              pst::ParameterShard* server, AdminHooks hooks,
                                              const ClusterSecurity& security,
                                              const RpcLimits& limits, bool shared_memory) {
  PST_RETURN_IF_ERROR(ValidateRpcLimits(limits));
  RunningServer running;
  running.service = std::make_unique<ParameterServerService>(server, std::move(hooks), limits,
                                                               shared_memory, security.has_token());
  absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create(
      {.max_connections = limits.max_connections > 0 ? limits.max_connections
                                                     : MaxConnectionsAfterRaisingFileLimit(),
       .max_connections_per_source = limits.max_connections_per_source,
       .handshake_timeout = limits.handshake_timeout});
  if (!gate.ok()) return gate.status();
  running.service->set_connection_gate(*gate);
  running.gate = *gate;
  grpc::ServerBuilder builder;
  // The gate listens and accepts itself (without SO_REUSEPORT: a second
  // ps_server for the same shard cannot bind beside this one), and hands the
  // server only the connections within its caps.
  absl::StatusOr<int> port = running.gate->Listen(address, ServerCredentials(security), &builder);
  if (!port.ok()) return port.status();
  running.port = *port;
  builder.RegisterService(running.service.get());
  builder.SetMaxReceiveMessageSize(limits.max_request_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC's default is no bound: calls a client opens on one connection
  // would cost the PS memory without end. A worker has a handful open.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxCallsPerConnection);
  // Workers of a replicated shard ping every second while a call is open
  // (ShardChannel), to find a primary cut off by the network: such pings
  // are no abuse, and gRPC's default would end their connections after two.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(limits.connection_idle_timeout),
                                         std::numeric_limits<int>::max())));
  // What gRPC itself may hold for messages in flight (a request still
  // arriving, an answer not yet read): without a bound, requests declared
  // large and sent in part held their bytes for good (8 of them: 1.5 GB).
  // Under the bound gRPC reads more slowly and, pressed, ends calls with
  // RESOURCE_EXHAUSTED, which workers retry.
  grpc::ResourceQuota quota("ps_server");
  quota.Resize(static_cast<size_t>(TransportMemoryBytes(limits)));
  builder.SetResourceQuota(quota);
  ParameterServerService* service = running.service.get();
  running.grpc_server =
      QueueServer::Start(&builder, ServerThreads(limits),
                         [service](grpc::ServerCompletionQueue* queue) { service->RequestCalls(queue); });
  if (!running.grpc_server) {
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server on ", address));
  }
  // Only now: gRPC drops connections handed to a server not yet started.
  running.gate->Serve();
  return running;
}

}  // namespace pst
