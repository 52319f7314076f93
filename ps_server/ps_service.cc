#include "ps_server/ps_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "ps_server/chunk_streams.h"
#include "ps_server/ps_metrics.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_status.h"

namespace pst {

namespace {

// Heap freed by dropped buffers before it is given back to the system.
constexpr int64_t kTrimAfterFreeing = 16 << 20;

// Bytes of payload a reassembly buffer holds.
int64_t BufferBytes(const PushRequest& buffer) {
  int64_t bytes = 0;
  for (const Tensor& gradient : buffer.gradients()) {
    bytes += static_cast<int64_t>(gradient.data().capacity());
  }
  return bytes;
}

// One AwaitWorkersDone: a waiter in the shard while it waits, no thread.
class AwaitWorkersDoneCall final : public grpc::ServerUnaryReactor {
 public:
  AwaitWorkersDoneCall(ParameterShard* shard, ThreadPool* threads,
                       const AwaitWorkersDoneRequest* request, StatsResponse* response,
                       absl::Time deadline)
      : shard_(shard), threads_(threads), request_(request), response_(response),
        deadline_(deadline) {}

  // Answers if it can, else leaves a waiter whose wake calls again.
  void Step() {
    std::optional<absl::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      wait_ = 0;
      if (finished_) return;
      if (cancelled_) {
        finish = absl::CancelledError("the caller went away while AwaitWorkersDone waited");
      } else {
        Ref();  // the waiter's, if one is left
        absl::StatusOr<ParameterShard::WaitId> waited =
            shard_->AwaitWorkersDoneOrWait(*request_, deadline_, response_, [this] {
              threads_->Post([this] {
                Step();
                Unref();
              });
            });
        if (waited.ok() && *waited != 0) {
          wait_ = *waited;
          return;
        }
        refs_.fetch_sub(1);  // never the last: the caller of Step holds one
        finish = waited.ok() ? absl::OkStatus() : waited.status();
      }
      finished_ = true;
    }
    Finish(ToGrpcStatus(*finish));
  }

  void OnCancel() override {
    ParameterShard::WaitId waiting = 0;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      waiting = wait_;
    }
    if (waiting != 0 && shard_->CancelWait(waiting)) {
      Unref();
      Step();  // finishes it, cancelled
    }
  }

  void OnDone() override { Unref(); }

 private:
  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  ParameterShard* const shard_;
  ThreadPool* const threads_;
  const AwaitWorkersDoneRequest* const request_;
  StatsResponse* const response_;
  const absl::Time deadline_;
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  absl::Mutex mu_;
  ParameterShard::WaitId wait_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

ParameterServerService::ParameterServerService(pst::ParameterShard* server, AdminHooks hooks,
                                               const RpcLimits& limits, bool shared_memory)
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
      streams_(limits, [this] { return PushBufferBudget(); }),
      exchange_{
          .shard = server,
          .limits = &limits_,
          .streams = &streams_,
          .regions = &shm_regions_,
          .payloads = &pull_payloads_,
          .take_push_buffer = [this] { return push_buffers_.Take(); },
          .return_push_buffer =
              [this](std::unique_ptr<PushRequest> buffer) { ReturnPushBuffer(std::move(buffer)); },
          .answers = &answer_threads_,
          .blocking = &blocking_threads_,
      } {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ParameterServerService::Exchange(
    grpc::CallbackServerContext* context) {
  return StartExchange(exchange_, context);
}

grpc::ServerUnaryReactor* ParameterServerService::AwaitWorkersDone(
    grpc::CallbackServerContext* context, const AwaitWorkersDoneRequest* request,
    StatsResponse* response) {
  const absl::Duration asked = absl::Milliseconds(std::max(0, request->timeout_ms()));
  const absl::Time deadline = std::min(absl::Now() + std::min(asked, limits_.max_pull_wait),
                                       absl::FromChrono(context->deadline()));
  auto* call = new AwaitWorkersDoneCall(server_, &answer_threads_, request, response, deadline);
  call->Step();
  return call;
}

int64_t ParameterServerService::PushBufferBudget() const {
  if (limits_.max_push_buffer_bytes > 0) return limits_.max_push_buffer_bytes;
  return (static_cast<int64_t>(server_->num_workers()) + 1) * server_->parameter_bytes();
}

void ParameterServerService::ReturnPushBuffer(std::unique_ptr<PushRequest> buffer) {
  const int64_t bytes = BufferBytes(*buffer);
  if (push_buffers_.Give(std::move(buffer))) return;
  if (freed_since_trim_.fetch_add(bytes) + bytes >= kTrimAfterFreeing) {
    freed_since_trim_.store(0);
    ReturnFreedMemory();
  }
}

grpc::Status ParameterServerService::Register(grpc::ServerContext*, const RegisterRequest* request,
                                              RegisterResponse* response) {
  return ToGrpcStatus(server_->Register(*request, response));
}

grpc::Status ParameterServerService::Init(grpc::ServerContext*, const InitRequest* request,
                                          InitResponse* response) {
  return ToGrpcStatus(server_->Init(*request, response));
}

grpc::Status ParameterServerService::ShmAttach(grpc::ServerContext*,
                                               const ShmAttachRequest* request,
                                               ShmAttachResponse* response) {
  return ToGrpcStatus(shm_regions_.Attach(*request, response));
}

grpc::Status ParameterServerService::Heartbeat(grpc::ServerContext*,
                                               const HeartbeatRequest* request,
                                               HeartbeatResponse* response) {
  return ToGrpcStatus(server_->Heartbeat(*request, response));
}

grpc::Status ParameterServerService::Done(grpc::ServerContext*, const DoneRequest* request,
                                          DoneResponse* response) {
  return ToGrpcStatus(server_->Done(*request, response));
}

grpc::Status ParameterServerService::Stats(grpc::ServerContext*, const StatsRequest*,
                                           StatsResponse* response) {
  server_->Stats(response);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Checkpoint(grpc::ServerContext*, const CheckpointRequest*,
                                                CheckpointResponse* response) {
  if (!hooks_.checkpoint) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this PS has no checkpoint directory (training.checkpoint.dir)");
  }
  absl::StatusOr<CheckpointResponse> written = hooks_.checkpoint();
  if (!written.ok()) return ToGrpcStatus(written.status());
  *response = *written;
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::Shutdown(grpc::ServerContext*, const ShutdownRequest*,
                                              ShutdownResponse*) {
  if (!hooks_.shutdown) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this PS cannot be shut down remotely");
  }
  hooks_.shutdown();
  return grpc::Status::OK;
}

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& address,
                                              pst::ParameterShard* server, AdminHooks hooks,
                                              const ClusterSecurity& security,
                                              const RpcLimits& limits, bool shared_memory) {
  if (absl::Status s = ValidateRpcLimits(limits); !s.ok()) return s;
  RunningServer running;
  running.service = std::make_unique<ParameterServerService>(server, std::move(hooks), limits,
                                                               shared_memory);
  grpc::ServerBuilder builder;
  // Every unary call of the sync API holds a thread while it runs: without
  // a bound, a flood of calls would grow the process's threads without
  // one. Past it, gRPC answers RESOURCE_EXHAUSTED at once. (Exchanges and
  // AwaitWorkersDone run on gRPC's callbacks and hold none while they wait.)
  grpc::ResourceQuota quota("ps_server");
  quota.SetMaxThreads(limits.max_server_threads);
  builder.SetResourceQuota(quota);
  builder.AddListeningPort(address, ServerCredentials(security), &running.port);
  // gRPC sets SO_REUSEPORT by default: a second ps_server started for the
  // same shard would then bind beside the first, and the kernel would split
  // the workers' connections between two shards of different state.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(running.service.get());
  builder.SetMaxReceiveMessageSize(limits.max_request_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  running.grpc_server = builder.BuildAndStart();
  if (!running.grpc_server || running.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, "; is the port in use or the address not on this host?"));
  }
  return running;
}

}  // namespace pst
