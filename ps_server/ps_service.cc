#include "ps_server/ps_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "google/protobuf/descriptor.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "ps_server/chunk_streams.h"
#include "ps_server/ps_metrics.h"
#include "ps_server/shm_exchange.h"
#include "rpc/chunk_wire.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_status.h"

namespace pst {

namespace {

// The index gRPC's generated service gives `method` of ParameterServer: its
// position in the proto.
int MethodIndex(const char* method) {
  return google::protobuf::DescriptorPool::generated_pool()
      ->FindServiceByName(ParameterServer::service_full_name())
      ->FindMethodByName(method)
      ->index();
}

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
      streams_(limits, [this] { return PushBufferBudget(); }) {
  // The streamed methods get byte-buffer handlers in place of the generated
  // ones. gRPC serves a replaced ("streamed") handler as a bidi stream, so
  // the pull handler reads its request itself; on the wire nothing changes.
  MarkMethodStreamed(
      MethodIndex("PullStream"),
      new grpc::internal::BidiStreamingHandler<ParameterServerService, PullRequest,
                                                 grpc::ByteBuffer>(
          [](ParameterServerService* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<grpc::ByteBuffer, PullRequest>* stream) {
            return service->ServePullStream(context, stream);
          },
          this));
  MarkMethodStreamed(
      MethodIndex("PushStream"),
      new grpc::internal::ClientStreamingHandler<ParameterServerService, grpc::ByteBuffer,
                                                 PushResponse>(
          [](ParameterServerService* service, grpc::ServerContext* context,
             grpc::ServerReader<grpc::ByteBuffer>* reader, PushResponse* response) {
            return service->ServePushStream(context, reader, response);
          },
          this));
  MarkMethodStreamed(
      MethodIndex("PushPull"),
      new grpc::internal::BidiStreamingHandler<ParameterServerService, grpc::ByteBuffer,
                                                 grpc::ByteBuffer>(
          [](ParameterServerService* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
            return service->ServePushPull(context, stream);
          },
          this));
}

grpc::Status ParameterServerService::Register(grpc::ServerContext*, const RegisterRequest* request,
                                              RegisterResponse* response) {
  return ToGrpcStatus(server_->Register(*request, response));
}

grpc::Status ParameterServerService::Init(grpc::ServerContext*, const InitRequest* request,
                                          InitResponse* response) {
  return ToGrpcStatus(server_->Init(*request, response));
}

namespace {

// Bytes of payload a reassembly buffer holds.
int64_t BufferBytes(const PushRequest& buffer) {
  int64_t bytes = 0;
  for (const Tensor& gradient : buffer.gradients()) {
    bytes += static_cast<int64_t>(gradient.data().capacity());
  }
  return bytes;
}

// Heap freed by dropped buffers before it is given back to the system.
constexpr int64_t kTrimAfterFreeing = 16 << 20;

// Ends `context`'s call with `status` (the idle watchdog's): the client sees
// that status, and a Read or Write blocked on the call returns false.
std::function<void(const absl::Status&)> EndCall(grpc::ServerContext* context) {
  return [context](const absl::Status& status) {
    const std::string message(status.message());
    grpc_call_cancel_with_status(context->c_call(), static_cast<grpc_status_code>(status.code()),
                                 message.c_str(), nullptr);
  };
}

// Whether the client of `context` has cancelled the call or gone away.
std::function<bool()> CallerGone(grpc::ServerContext* context) {
  return [context] { return context->IsCancelled(); };
}

// What a streamed call returns: the watchdog's status, if it ended the
// call, over whatever the ended call's last read or write made of it.
absl::Status StreamOutcome(const OpenStreams::Stream& stream, absl::Status status) {
  absl::Status ended = stream.ended();
  return ended.ok() ? status : ended;
}

}  // namespace

int64_t ParameterServerService::PushBufferBudget() const {
  if (limits_.max_push_buffer_bytes > 0) return limits_.max_push_buffer_bytes;
  return (static_cast<int64_t>(server_->num_workers()) + 1) * server_->parameter_bytes();
}

absl::Status ParameterServerService::AdmitPush(const PushRequest& header, int64_t buffered_bytes,
                                               OpenStreams::Stream* stream) const {
  if (absl::Status s = CheckPushSize(header, limits_); !s.ok()) return s;
  if (absl::Status s = stream->ClaimWorker(header.worker()); !s.ok()) return s;
  if (buffered_bytes > 0) return stream->ReservePushBuffer(buffered_bytes);
  return absl::OkStatus();
}

void ParameterServerService::ReturnPushBuffer(std::unique_ptr<PushRequest> buffer) {
  const int64_t bytes = BufferBytes(*buffer);
  if (push_buffers_.Give(std::move(buffer))) return;
  if (freed_since_trim_.fetch_add(bytes) + bytes >= kTrimAfterFreeing) {
    freed_since_trim_.store(0);
    ReturnFreedMemory();
  }
}

grpc::Status ParameterServerService::Pull(grpc::ServerContext* context,
                                          const PullRequest* request, PullResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status = CheckPullNames(*request, limits_);
  if (status.ok()) {
    status = server_->Pull(
        *request,
        PullWaitDeadline(start, *request, absl::FromChrono(context->deadline()), limits_),
        response, {.caller_gone = CallerGone(context), .max_reply_bytes = limits_.max_reply_bytes});
  }
  RecordServedPull(status.ok() ? response->ByteSizeLong() : 0, status, absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ServePullStream(
    grpc::ServerContext* context, grpc::ServerReaderWriter<grpc::ByteBuffer, PullRequest>* stream) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<OpenStreams::Stream>> admitted = streams_.Admit(EndCall(context));
  if (!admitted.ok()) {
    RecordServedPull(0, admitted.status(), absl::Now() - start);
    return ToGrpcStatus(admitted.status());
  }
  OpenStreams::Stream& open = **admitted;
  PullRequest request;
  bool read = false;
  {
    OpenStreams::Stream::ClientWait wait(&open);
    read = stream->Read(&request);
  }
  absl::Status status =
      read ? CheckPullNames(request, limits_)
           : absl::InvalidArgumentError("a pull stream carried no PullRequest");
  if (status.ok()) status = open.ClaimWorker(request.worker());
  if (status.ok()) {
    std::shared_ptr<PullPayload> payload = pull_payloads_.Take();
    status = server_->PullVisit(
        request,
        PullWaitDeadline(absl::Now(), request, absl::FromChrono(context->deadline()), limits_),
        [&](int64_t version, const std::vector<const Variable*>& variables) {
          CapturePull(version, variables, request.dtype(), payload.get());
        },
        {.caller_gone = CallerGone(context)});
    int64_t bytes_sent = 0;
    if (!status.ok()) payload->values.clear();  // nothing captured may stay pinned
    if (status.ok()) {
      bytes_sent = SendPullPayload(payload, [stream, &open](const grpc::ByteBuffer& message,
                                                            grpc::WriteOptions options) {
        OpenStreams::Stream::ClientWait wait(&open);
        return stream->Write(message, options);
      });
      if (bytes_sent < 0) {
        status = absl::CancelledError("the worker went away during a pull stream");
      }
    }
    status = StreamOutcome(open, status);
    RecordServedPull(status.ok() ? bytes_sent : 0, status, absl::Now() - start);
    return ToGrpcStatus(status);
  }
  status = StreamOutcome(open, status);
  RecordServedPull(0, status, absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ServePushStream(grpc::ServerContext* context,
                                                     grpc::ServerReader<grpc::ByteBuffer>* reader,
                                                     PushResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<OpenStreams::Stream>> admitted = streams_.Admit(EndCall(context));
  if (!admitted.ok()) {
    RecordServedPush(0, 0, *response, admitted.status(), absl::Now() - start);
    return ToGrpcStatus(admitted.status());
  }
  OpenStreams::Stream& open = **admitted;
  std::unique_ptr<PushRequest> buffer = push_buffers_.Take();
  ReceivedPush received;
  const PushStreamHooks hooks{
      .cancel = [context] { context->TryCancel(); },
      .admit = [this, &open](const PushRequest& header,
                             int64_t buffered) { return AdmitPush(header, buffered, &open); },
  };
  absl::Status status = pst::ServePushStream(
      [reader, &open](grpc::ByteBuffer* message) {
        OpenStreams::Stream::ClientWait wait(&open);
        return reader->Read(message);
      },
      hooks, server_, buffer.get(), response, &received);
  status = StreamOutcome(open, status);
  ReturnPushBuffer(std::move(buffer));
  RecordServedPush(received.bytes, received.computed_at_version, *response, status,
                   absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ServePushPull(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  const absl::Time start = absl::Now();
  PushResponse response;
  absl::StatusOr<std::unique_ptr<OpenStreams::Stream>> admitted = streams_.Admit(EndCall(context));
  if (!admitted.ok()) {
    RecordServedPush(0, 0, response, admitted.status(), absl::Now() - start);
    return ToGrpcStatus(admitted.status());
  }
  OpenStreams::Stream& open = **admitted;
  std::unique_ptr<PushRequest> buffer = push_buffers_.Take();
  const PushPullContext call{
      .shard = server_,
      .buffer = buffer.get(),
      .payloads = &pull_payloads_,
      .threads = &threads_,
      .pull_deadline =
          [this, context](const PullRequest& pull) {
            return PullWaitDeadline(absl::Now(), pull, absl::FromChrono(context->deadline()),
                                    limits_);
          },
      .caller_gone = CallerGone(context),
  };
  const PushStreamHooks hooks{
      .cancel = [context] { context->TryCancel(); },
      .admit = [this, &open](const PushRequest& header,
                             int64_t buffered) { return AdmitPush(header, buffered, &open); },
  };
  ReceivedPush received;
  int64_t bytes_sent = 0;
  absl::Status status = pst::ServePushPull(
      [stream, &open](grpc::ByteBuffer* message) {
        OpenStreams::Stream::ClientWait wait(&open);
        return stream->Read(message);
      },
      [stream, &open](const grpc::ByteBuffer& message, grpc::WriteOptions options) {
        OpenStreams::Stream::ClientWait wait(&open);
        return stream->Write(message, options);
      },
      hooks, call, &response, &received, &bytes_sent);
  status = StreamOutcome(open, status);
  ReturnPushBuffer(std::move(buffer));
  const absl::Duration took = absl::Now() - start;
  RecordServedPush(received.bytes, received.computed_at_version, response, status, took);
  RecordServedPull(status.ok() ? bytes_sent : 0, status, took);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::Push(grpc::ServerContext*, const PushRequest* request,
                                          PushResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status = CheckPushSize(*request, limits_);
  if (status.ok()) status = server_->Push(*request, response);
  RecordServedPush(static_cast<int64_t>(request->ByteSizeLong()), request->computed_at_version(),
                   *response, status, absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::PushPullSmall(grpc::ServerContext* context,
                                                   const PushPullRequest* request,
                                                   PushPullResponse* response) {
  const absl::Time start = absl::Now();
  const PushRequest& push = request->push();
  absl::Status status = CheckPushSize(push, limits_);
  if (status.ok()) status = server_->Push(push, response->mutable_push());
  RecordServedPush(static_cast<int64_t>(push.ByteSizeLong()), push.computed_at_version(),
                   response->push(), status, absl::Now() - start);
  if (!status.ok()) return ToGrpcStatus(status);
  PullRequest pull = request->pull();
  AskForPushedVariables(push, &pull);
  const absl::Time pull_start = absl::Now();
  status = server_->Pull(
      pull, PullWaitDeadline(pull_start, pull, absl::FromChrono(context->deadline()), limits_),
      response->mutable_pull(),
      {.caller_gone = CallerGone(context), .max_reply_bytes = limits_.max_reply_bytes});
  RecordServedPull(status.ok() ? response->pull().ByteSizeLong() : 0, status,
                   absl::Now() - pull_start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ShmAttach(grpc::ServerContext*,
                                               const ShmAttachRequest* request,
                                               ShmAttachResponse* response) {
  return ToGrpcStatus(shm_regions_.Attach(*request, response));
}

grpc::Status ParameterServerService::ShmExchange(grpc::ServerContext* context,
                                                 const ShmExchangeRequest* request,
                                                 ShmExchangeResponse* response) {
  const absl::Time start = absl::Now();
  const bool pushes = request->push().gradients_size() > 0;
  const int worker = pushes ? request->push().worker() : request->pull().worker();
  absl::StatusOr<std::shared_ptr<const OpenedRegion>> region =
      shm_regions_.Claim(request->region(), worker, absl::FromChrono(context->deadline()));
  if (!region.ok()) return ToGrpcStatus(region.status());
  std::unique_ptr<PushRequest> buffer = push_buffers_.Take();
  const ShmExchangeContext call{
      .shard = server_,
      .limits = &limits_,
      .buffer = buffer.get(),
      .payloads = &pull_payloads_,
      .pull_deadline =
          [this, context, start](const PullRequest& pull) {
            return PullWaitDeadline(start, pull, absl::FromChrono(context->deadline()), limits_);
          },
      .caller_gone = CallerGone(context),
  };
  ShmExchangeBytes bytes;
  absl::Status status = ServeShmExchange(*request, **region, call, response, &bytes);
  ReturnPushBuffer(std::move(buffer));
  const absl::Duration took = absl::Now() - start;
  if (pushes) {
    RecordServedPush(bytes.pushed, request->push().computed_at_version(), response->push(),
                     status, took);
  }
  if (request->has_pull()) RecordServedPull(status.ok() ? bytes.answered : 0, status, took);
  return ToGrpcStatus(status);
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

grpc::Status ParameterServerService::AwaitWorkersDone(grpc::ServerContext* context,
                                                      const AwaitWorkersDoneRequest* request,
                                                      StatsResponse* response) {
  const absl::Duration asked = absl::Milliseconds(std::max(0, request->timeout_ms()));
  const absl::Time deadline = std::min(absl::Now() + std::min(asked, limits_.max_pull_wait),
                                       absl::FromChrono(context->deadline()));
  return ToGrpcStatus(server_->AwaitWorkersDone(*request, deadline, response, CallerGone(context)));
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
  // Every call of the sync API holds a thread while it runs (a long-polling
  // pull, an open stream): without a bound, calls that never end would
  // grow the process's threads without one. Past it, gRPC answers
  // RESOURCE_EXHAUSTED at once.
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
