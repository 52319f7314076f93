// The service's generated base on gRPC's completion-queue API: every method
// is requested and answered through the server's completion queues
// (rpc/completion_tag.h), Exchange over raw byte buffers (rpc/chunk_wire.h),
// and Init too, so that its size is paid for only when it can matter (see
// ParameterServerService::ServeInit).
// No method is served by gRPC's sync thread pool, so the queues' threads
// are the only ones that take the server's socket events.
#ifndef PST_PS_SERVER_SERVICE_ASYNC_SERVICE_H_
#define PST_PS_SERVER_SERVICE_ASYNC_SERVICE_H_

#include "ps.grpc.pb.h"

namespace pst {

using AsyncParameterServer = ParameterServer::WithRawMethod_Init<
    ParameterServer::WithRawMethod_Exchange<ParameterServer::AsyncService>>;

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_ASYNC_SERVICE_H_
