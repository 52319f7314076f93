#include "common/region_handoff.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pst {

namespace {

// A refusal's reason is cut to this, so that a reply is one small message.
constexpr size_t kMaxReasonBytes = 256;

// code, then handle, then the reason.
constexpr size_t kReplyHeaderBytes = 1 + sizeof(uint64_t);

}  // namespace

std::string RandomBytes(size_t bytes) {
  std::string random(bytes, '\0');
  for (size_t filled = 0; filled < bytes;) {
    const ssize_t n = getrandom(random.data() + filled, bytes - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return random;
}

socklen_t AbstractSocketAddress(absl::string_view name, void* address) {
  sockaddr_un* unix_address = static_cast<sockaddr_un*>(address);
  std::memset(unix_address, 0, sizeof(*unix_address));
  unix_address->sun_family = AF_UNIX;
  const size_t length = std::min(name.size(), sizeof(unix_address->sun_path) - 1);
  std::memcpy(unix_address->sun_path + 1, name.data(), length);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

absl::StatusOr<uid_t> PeerUid(int fd) {
  ucred credentials = {};
  socklen_t length = sizeof(credentials);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot read a Unix peer's credentials: ", std::strerror(errno)));
  }
  return credentials.uid;
}

std::string EncodeHandoffReply(const absl::StatusOr<uint64_t>& result) {
  std::string reply(kReplyHeaderBytes, '\0');
  reply[0] = static_cast<char>(result.status().code());
  const uint64_t handle = result.ok() ? *result : 0;
  std::memcpy(reply.data() + 1, &handle, sizeof(handle));
  if (!result.ok()) {
    absl::StrAppend(&reply, result.status().message().substr(0, kMaxReasonBytes));
  }
  return reply;
}

absl::StatusOr<uint64_t> DecodeHandoffReply(absl::string_view reply) {
  if (reply.size() < kReplyHeaderBytes || reply.size() > kReplyHeaderBytes + kMaxReasonBytes) {
    return absl::UnavailableError("the shard's answer to a region handoff is malformed");
  }
  const int code = static_cast<unsigned char>(reply[0]);
  if (code != 0) {
    constexpr int kLastCode = static_cast<int>(absl::StatusCode::kUnauthenticated);
    return absl::Status(code <= kLastCode ? static_cast<absl::StatusCode>(code)
                                          : absl::StatusCode::kUnknown,
                        reply.substr(kReplyHeaderBytes));
  }
  uint64_t handle = 0;
  std::memcpy(&handle, reply.data() + 1, sizeof(handle));
  return handle;
}

absl::StatusOr<uint64_t> HandOverRegion(absl::string_view socket_name, absl::string_view nonce,
                                        int fd, absl::Duration timeout) {
  const int socket_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (socket_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create a Unix socket: ", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{socket_fd};
  const timeval wait = absl::ToTimeval(timeout);
  setsockopt(socket_fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
  setsockopt(socket_fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  sockaddr_un address;
  const socklen_t length = AbstractSocketAddress(socket_name, &address);
  if (connect(socket_fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot reach the shard's region socket (",
                                               std::strerror(errno),
                                               "): it runs in another network namespace"));
  }
  // Whoever listens gets this process's memory: only a process of this
  // user may (it could read that memory anyway).
  absl::StatusOr<uid_t> peer = PeerUid(socket_fd);
  if (!peer.ok()) return peer.status();
  if (*peer != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the shard's region socket belongs to user ", *peer, ", not to this one (", geteuid(),
        ")"));
  }
  iovec data{const_cast<char*>(nonce.data()), nonce.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message = {};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  cmsghdr* rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(rights), &fd, sizeof(int));
  if (sendmsg(socket_fd, &message, MSG_NOSIGNAL) != static_cast<ssize_t>(nonce.size())) {
    return absl::UnavailableError(
        absl::StrCat("cannot hand the region to the shard's socket: ", std::strerror(errno)));
  }
  char reply[kReplyHeaderBytes + kMaxReasonBytes];
  const ssize_t received = recv(socket_fd, reply, sizeof(reply), 0);
  if (received <= 0) {
    return absl::UnavailableError(absl::StrCat("the shard did not answer the region handoff: ",
                                               received < 0 ? std::strerror(errno) : "closed"));
  }
  return DecodeHandoffReply(absl::string_view(reply, static_cast<size_t>(received)));
}

}  // namespace pst
