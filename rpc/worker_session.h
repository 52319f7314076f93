// Which process speaks for a worker. Every call a worker process makes
// carries its session, a random number drawn once per process, in the
// call's metadata; a PS lets one session at a time act as a worker
// (ps_server/worker_sessions.h), so a local process that names another's
// worker id is refused while that worker's lease is live, instead of
// taking its exchanges or its shared region. It is not a secret: with
// cluster.auth the token says who may call at all.
#ifndef PST_RPC_WORKER_SESSION_H_
#define PST_RPC_WORKER_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace pst {

// The metadata that carries a session: "pstrain-session: <decimal>".
inline constexpr char kSessionMetadataKey[] = "pstrain-session";

// This process's session: random, never 0, the same for every call.
uint64_t ProcessSession();

// A channel to `address` whose every call carries `session`.
std::shared_ptr<grpc::Channel> CreateSessionChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& args, uint64_t session);

// The session a call carries; 0 if none (or not a number).
uint64_t SessionOf(const grpc::ServerContext& context);

}  // namespace pst

#endif  // PST_RPC_WORKER_SESSION_H_
