// The gRPC credentials of a cluster's security (common/security.h): a PS's
// server credentials (TLS, the optional client-certificate check, and a
// token check on every call) and the matching channel credentials of its
// clients (TLS, client certificate, the token as call metadata). Without
// cluster.tls both are plaintext.
#ifndef PST_RPC_GRPC_CREDENTIALS_H_
#define PST_RPC_GRPC_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/security.h"
#include "grpcpp/server_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace pst {

// For grpc::ServerBuilder::AddListeningPort. With a token, every call
// without it or a task token made from it (TaskToken) fails UNAUTHENTICATED
// before it reaches the service; a task token's task is then the call's
// (TokenTaskOf).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const ClusterSecurity& security);

// For grpc::CreateCustomChannel, together with ConfigureChannel.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ClusterSecurity& security);

// Sets the name expected in the PS certificate when tls.server_name is given.
void ConfigureChannel(const ClusterSecurity& security, grpc::ChannelArguments* args);

// The task a served call's token is the task token of ("worker:3"); "" for
// the cluster token, or a server without a token.
std::string TokenTaskOf(const grpc::ServerContext& context);

// PermissionDenied if the call's token is another task's than `worker`'s.
absl::Status CheckActsAs(const grpc::ServerContext& context, int worker);

// PermissionDenied if the call's token is a task token: `what` (shut the
// PS down, write a checkpoint) is for the cluster token's holders.
absl::Status CheckClusterToken(const grpc::ServerContext& context, absl::string_view what);

}  // namespace pst

#endif  // PST_RPC_GRPC_CREDENTIALS_H_
