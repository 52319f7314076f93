// absl::Status <-> grpc::Status. The two share their code numbering, so the
// conversion keeps the code and the message; a status's payloads (such as a
// transient refusal's mark, common/transient_refusal.h) travel in the
// status details (grpc-status-details-bin), laid out as google.rpc.Status
// with one Any per payload, so a peer reads them as it reads any gRPC
// server's error details.
#ifndef PST_RPC_GRPC_STATUS_H_
#define PST_RPC_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace pst {

// Largest message a server or client accepts; gRPC's default of 4 MiB is too
// small for real models.
inline constexpr int kMaxMessageBytes = 1 << 30;

grpc::Status ToGrpcStatus(const absl::Status& status);
// Details that do not parse are dropped: the code and message stand alone.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pst

#endif  // PST_RPC_GRPC_STATUS_H_
