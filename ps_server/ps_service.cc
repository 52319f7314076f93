#include "ps_server/ps_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/grpc_status.h"
#include "ps_server/chunk_streams.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/server_builder.h"
#include "ps_server/ps_metrics.h"

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

ParameterServerService::ParameterServerService(pst::ParameterShard* server, AdminHooks hooks)
    : server_(server), hooks_(std::move(hooks)) {
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

// Wait no longer than the client asked for, nor past the call's deadline.
absl::Time PullDeadline(const grpc::ServerContext& context, const PullRequest& request) {
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(std::max(0, request.timeout_ms()));
  return std::min(deadline, absl::FromChrono(context.deadline()));
}

}  // namespace

grpc::Status ParameterServerService::Pull(grpc::ServerContext* context,
                                          const PullRequest* request, PullResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status = server_->Pull(*request, PullDeadline(*context, *request), response);
  RecordServedPull(status.ok() ? response->ByteSizeLong() : 0, status, absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ServePullStream(
    grpc::ServerContext* context, grpc::ServerReaderWriter<grpc::ByteBuffer, PullRequest>* stream) {
  const absl::Time start = absl::Now();
  PullRequest request;
  if (!stream->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a pull stream carried no PullRequest");
  }
  std::shared_ptr<PullPayload> payload = pull_payloads_.Take();
  absl::Status status = server_->PullVisit(
      request, PullDeadline(*context, request),
      [&](int64_t version, const std::vector<const Variable*>& variables) {
        CapturePull(version, variables, request.dtype(), payload.get());
      });
  int64_t bytes_sent = 0;
  if (!status.ok()) payload->values.clear();  // nothing captured may stay pinned
  if (status.ok()) {
    bytes_sent = SendPullPayload(payload, [stream](const grpc::ByteBuffer& message,
                                                   grpc::WriteOptions options) {
      return stream->Write(message, options);
    });
    if (bytes_sent < 0) status = absl::CancelledError("the worker went away during a pull stream");
  }
  RecordServedPull(status.ok() ? bytes_sent : 0, status, absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ServePushStream(grpc::ServerContext* context,
                                                     grpc::ServerReader<grpc::ByteBuffer>* reader,
                                                     PushResponse* response) {
  const absl::Time start = absl::Now();
  std::unique_ptr<PushRequest> buffer = push_buffers_.Take();
  ReceivedPush received;
  absl::Status status = pst::ServePushStream(
      [reader](grpc::ByteBuffer* message) { return reader->Read(message); },
      [context] { context->TryCancel(); }, server_, buffer.get(), response, &received);
  push_buffers_.Give(std::move(buffer));
  RecordServedPush(received.bytes, received.computed_at_version, *response, status,
                   absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::ServePushPull(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  const absl::Time start = absl::Now();
  std::unique_ptr<PushRequest> buffer = push_buffers_.Take();
  const PushPullContext call{
      .shard = server_,
      .buffer = buffer.get(),
      .payloads = &pull_payloads_,
      .threads = &threads_,
      .pull_deadline = [context](const PullRequest& pull) { return PullDeadline(*context, pull); },
  };
  PushResponse response;
  ReceivedPush received;
  int64_t bytes_sent = 0;
  absl::Status status = pst::ServePushPull(
      [stream](grpc::ByteBuffer* message) { return stream->Read(message); },
      [stream](const grpc::ByteBuffer& message, grpc::WriteOptions options) {
        return stream->Write(message, options);
      },
      [context] { context->TryCancel(); }, call, &response, &received, &bytes_sent);
  push_buffers_.Give(std::move(buffer));
  const absl::Duration took = absl::Now() - start;
  RecordServedPush(received.bytes, received.computed_at_version, response, status, took);
  RecordServedPull(status.ok() ? bytes_sent : 0, status, took);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::Push(grpc::ServerContext*, const PushRequest* request,
                                          PushResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status status = server_->Push(*request, response);
  RecordServedPush(static_cast<int64_t>(request->ByteSizeLong()), request->computed_at_version(),
                   *response, status, absl::Now() - start);
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerService::PushPullSmall(grpc::ServerContext* context,
                                                   const PushPullRequest* request,
                                                   PushPullResponse* response) {
  const absl::Time start = absl::Now();
  const PushRequest& push = request->push();
  absl::Status status = server_->Push(push, response->mutable_push());
  RecordServedPush(static_cast<int64_t>(push.ByteSizeLong()), push.computed_at_version(),
                   response->push(), status, absl::Now() - start);
  if (!status.ok()) return ToGrpcStatus(status);
  PullRequest pull = request->pull();
  AskForPushedVariables(push, &pull);
  const absl::Time pull_start = absl::Now();
  status = server_->Pull(pull, PullDeadline(*context, pull), response->mutable_pull());
  RecordServedPull(status.ok() ? response->pull().ByteSizeLong() : 0, status,
                   absl::Now() - pull_start);
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
                                              int max_request_bytes) {
  RunningServer running;
  running.service = std::make_unique<ParameterServerService>(server, std::move(hooks));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, security.ServerCredentials(), &running.port);
  // gRPC sets SO_REUSEPORT by default: a second ps_server started for the
  // same shard would then bind beside the first, and the kernel would split
  // the workers' connections between two shards of different state.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(running.service.get());
  builder.SetMaxReceiveMessageSize(max_request_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  running.grpc_server = builder.BuildAndStart();
  if (!running.grpc_server || running.port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, "; is the port in use or the address not on this host?"));
  }
  return running;
}

}  // namespace pst
