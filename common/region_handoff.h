// How a worker hands a sealed region's descriptor to a shard on its host:
// over a Unix socket in the abstract namespace (no file, nothing to race
// or leave behind) whose name the shard announced in its ShmAttach answer.
//
// The worker sends one SOCK_SEQPACKET message: the attach answer's nonce,
// with the region's descriptor attached (SCM_RIGHTS). The shard answers
// with one message: a status code, the region's handle and, when refused,
// why (EncodeHandoffReply). Each end checks the other's credentials
// (SO_PEERCRED): both must run as the same user.
#ifndef PST_COMMON_REGION_HANDOFF_H_
#define PST_COMMON_REGION_HANDOFF_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pst {

// The bytes of the nonce a shard gives with each sealed attach.
inline constexpr size_t kHandoffNonceBytes = 32;

// `nonce_bytes` random bytes, from the kernel's generator.
std::string RandomBytes(size_t nonce_bytes);

// The sockaddr_un length of the abstract socket `name` (no leading NUL,
// at most 100 bytes), written into `address`.
socklen_t AbstractSocketAddress(absl::string_view name, void* address);

// The user id of the process at the other end of the Unix socket `fd`.
absl::StatusOr<uid_t> PeerUid(int fd);

// What the shard answers: `result` (a handle, or why it was refused).
std::string EncodeHandoffReply(const absl::StatusOr<uint64_t>& result);
absl::StatusOr<uint64_t> DecodeHandoffReply(absl::string_view reply);

// Hands `fd` (not closed here) with `nonce` to the shard listening on the
// abstract socket `socket_name`, and returns the region's handle it
// answers. Unavailable if the socket cannot be reached (the shard runs in
// another network namespace) or does not answer within `timeout`;
// PermissionDenied if it belongs to another user; otherwise the shard's
// refusal.
absl::StatusOr<uint64_t> HandOverRegion(absl::string_view socket_name, absl::string_view nonce,
                                        int fd, absl::Duration timeout);

}  // namespace pst

#endif  // PST_COMMON_REGION_HANDOFF_H_
