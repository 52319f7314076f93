// A refusal a worker waits out instead of the end of its run, and why.
//
// Whoever refuses for now (a shard overloaded, a shard that no longer holds
// a worker's shared region, a shard stopping) marks its status with
// MarkTransient; the mark is a status payload, which rpc/grpc_status.h
// carries across gRPC with every other payload, so the worker reads the
// class (TransientRefusalOf in worker/client/) and never the message. A
// status without the mark is no transient refusal of the shard's deciding:
// a size limit, a bad request, a wrong state.
#ifndef PST_COMMON_TRANSIENT_REFUSAL_H_
#define PST_COMMON_TRANSIENT_REFUSAL_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pst {

enum class TransientRefusal {
  kOverloaded,  // busy: too many calls, bytes or waits open; try again later
  kRegionLost,  // the worker's shared region is not (or no longer) known here
  kRestarting,  // stopping, starting, or away: rejoin once it is back
  kNotPrimary,  // a backup of the shard (or a deposed primary): find its primary
};

// The payload's type URL (the value: the class's name).
inline constexpr char kTransientRefusalPayload[] = "type.pstrain/transient_refusal";

// `status` (an error) marked as a transient refusal of class `why`.
absl::Status MarkTransient(absl::Status status, TransientRefusal why);

// The class `status` is marked with; nullopt for an unmarked status.
std::optional<TransientRefusal> MarkedTransient(const absl::Status& status);

// `status` with `message` instead of its own: the same code and payloads
// (a transient refusal's mark among them), for a caller that adds context.
absl::Status Reworded(const absl::Status& status, absl::string_view message);

// "overloaded", "region lost", "restarting", "not primary".
absl::string_view TransientRefusalName(TransientRefusal why);

}  // namespace pst

#endif  // PST_COMMON_TRANSIENT_REFUSAL_H_
