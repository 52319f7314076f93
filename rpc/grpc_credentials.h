// The gRPC credentials of a cluster's security (common/security.h): a PS's
// server credentials (TLS, the optional client-certificate check, and a
// token check on every call) and the matching channel credentials of its
// clients (TLS, client certificate, the token as call metadata). Without
// cluster.tls both are plaintext.
#ifndef PST_RPC_GRPC_CREDENTIALS_H_
#define PST_RPC_GRPC_CREDENTIALS_H_

#include <memory>

#include "common/security.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace pst {

// For grpc::ServerBuilder::AddListeningPort. With a token, every call
// without it (or with another) fails UNAUTHENTICATED before it reaches the
// service.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const ClusterSecurity& security);

// For grpc::CreateCustomChannel, together with ConfigureChannel.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ClusterSecurity& security);

// Sets the name expected in the PS certificate when tls.server_name is given.
void ConfigureChannel(const ClusterSecurity& security, grpc::ChannelArguments* args);

}  // namespace pst

#endif  // PST_RPC_GRPC_CREDENTIALS_H_
