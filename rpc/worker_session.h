// Which process speaks for a worker. Every call a worker process makes
// carries its session, a random number drawn once per process, in the
// call's metadata (AddProcessSession, where the client makes its calls); a PS lets one session at a time act as a worker
// (ps_server/service/worker_sessions.h), so a local process that names another's
// worker id is refused while that worker's lease is live, instead of
// taking its exchanges or its shared region. It is not a secret: with
// cluster.auth the token says who may call at all.
#ifndef PST_RPC_WORKER_SESSION_H_
#define PST_RPC_WORKER_SESSION_H_

#include <cstdint>

#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace pst {

// The metadata that carries a session: "pstrain-session: <decimal>".
inline constexpr char kSessionMetadataKey[] = "pstrain-session";

// This process's session: random, never 0, the same for every call.
uint64_t ProcessSession();

// Makes the call of `context` carry this process's session.
void AddProcessSession(grpc::ClientContext* context);

// The session a call carries; 0 if none (or not a number).
uint64_t SessionOf(const grpc::ServerContext& context);

}  // namespace pst

#endif  // PST_RPC_WORKER_SESSION_H_
