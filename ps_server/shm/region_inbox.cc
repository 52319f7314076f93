#include "ps_server/shm/region_inbox.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/region_handoff.h"
#include "spdlog/spdlog.h"

namespace pst {

namespace {

// Descriptors a message may carry before the rest are dropped by the
// kernel: room for more than one, so that an extra one is seen and closed.
constexpr int kMaxDescriptors = 4;

// How long a listener out of descriptors (EMFILE) is left unpolled, so
// that the backlog it cannot accept does not spin the thread.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

void Answer(int fd, const absl::StatusOr<uint64_t>& result) {
  const std::string reply = EncodeHandoffReply(result);
  // One small message on a fresh socket: it fits, or the peer is gone.
  [[maybe_unused]] const ssize_t sent =
      send(fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

// Reads the one message of connection `fd` and answers it: false if it
// has not arrived yet. Every descriptor it carried is handed to `adopt`
// or closed.
bool ServeConnection(int fd, const RegionInbox::Adopt& adopt, bool* refused) {
  char data[kHandoffNonceBytes + 1];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxDescriptors)];
  iovec buffer{data, sizeof(data)};
  msghdr message = {};
  message.msg_iov = &buffer;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t received = recvmsg(fd, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (received < 0 && (errno == EAGAIN || errno == EINTR)) return false;
  std::vector<int> descriptors;
  if (received >= 0) {
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received_fd;
        std::memcpy(&received_fd, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
        descriptors.push_back(received_fd);
      }
    }
  }
  const bool well_formed = received == static_cast<ssize_t>(kHandoffNonceBytes) &&
                           descriptors.size() == 1 &&
                           (message.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0;
  if (!well_formed) {
    for (int extra : descriptors) close(extra);
    *refused = true;
    Answer(fd, absl::InvalidArgumentError(absl::StrCat(
                   "a region handoff is one message of ", kHandoffNonceBytes,
                   " bytes (the attach's nonce) carrying one descriptor")));
    return true;
  }
  absl::StatusOr<uint64_t> adopted = adopt(absl::string_view(data, kHandoffNonceBytes),
                                           descriptors[0]);
  *refused = !adopted.ok();
  Answer(fd, adopted);
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegionInbox>> RegionInbox::Start(Adopt adopt, Limits limits) {
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listener < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create a Unix socket: ", strerror(errno)));
  }
  const std::string name =
      absl::StrCat("pstrain-ps-", getpid(), "-", absl::BytesToHexString(RandomBytes(8)));
  sockaddr_un address;
  const socklen_t length = AbstractSocketAddress(name, &address);
  if (bind(listener, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      listen(listener, 64) != 0) {
    const std::string error = strerror(errno);
    close(listener);
    return absl::UnavailableError(absl::StrCat("cannot listen on a Unix socket: ", error));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const std::string error = strerror(errno);
    close(listener);
    return absl::UnavailableError(absl::StrCat("cannot create an eventfd: ", error));
  }
  std::unique_ptr<RegionInbox> inbox(
      new RegionInbox(std::move(adopt), limits, name, listener, wake));
  inbox->thread_ = std::thread([inbox = inbox.get()] { inbox->Run(); });
  return inbox;
}

RegionInbox::~RegionInbox() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = write(wake_, &one, sizeof(one));
  thread_.join();
  close(listener_);
  close(wake_);
}

void RegionInbox::Serve(std::vector<Connection>* connections, const pollfd* polled,
                        absl::Time now) {
  std::vector<Connection> waiting;
  for (size_t i = 0; i < connections->size(); ++i) {
    const Connection& connection = (*connections)[i];
    bool refused = false;
    if (polled[i].revents != 0 && ServeConnection(connection.fd, adopt_, &refused)) {
      if (refused) refused_.fetch_add(1, std::memory_order_relaxed);
      close(connection.fd);
    } else if (now >= connection.deadline) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      Answer(connection.fd, absl::DeadlineExceededError(
                                "no region handoff came within the deadline of a connection"));
      close(connection.fd);
    } else {
      waiting.push_back(connection);
    }
  }
  connections->swap(waiting);
}

void RegionInbox::ServeReadyNow(std::vector<Connection>* connections) {
  std::vector<pollfd> polled;
  for (const Connection& connection : *connections) {
    polled.push_back({.fd = connection.fd, .events = POLLIN, .revents = 0});
  }
  if (poll(polled.data(), polled.size(), 0) < 0) return;
  Serve(connections, polled.data(), absl::Now());
}

void RegionInbox::Run() {
  std::vector<Connection> connections;
  std::vector<pollfd> polled;
  absl::Time accept_paused_until = absl::InfinitePast();
  const uid_t own_uid = geteuid();
  for (;;) {
    absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until;
    absl::Time next = accepting ? absl::InfiniteFuture() : accept_paused_until;
    polled.clear();
    polled.push_back({.fd = wake_, .events = POLLIN, .revents = 0});
    polled.push_back({.fd = accepting ? listener_ : -1, .events = POLLIN, .revents = 0});
    for (const Connection& connection : connections) {
      polled.push_back({.fd = connection.fd, .events = POLLIN, .revents = 0});
      next = std::min(next, connection.deadline);
    }
    const int timeout_ms =
        next == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::clamp<int64_t>(
                  absl::ToInt64Milliseconds(absl::Ceil(next - now, absl::Milliseconds(1))), 0,
                  60'000));
    if (poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("the region socket stopped: poll: {}", strerror(errno));
      break;
    }
    if (polled[0].revents != 0) break;
    now = absl::Now();
    Serve(&connections, polled.data() + 2, now);
    if ((polled[1].revents & POLLIN) == 0) continue;
    for (;;) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until = now + kAcceptPause;
        }
        break;
      }
      // What has come (or hung up) since the poll counts before the cap
      // does: a worker is not refused for connections already gone.
      if (static_cast<int>(connections.size()) >= limits_.max_pending) {
        ServeReadyNow(&connections);
      }
      absl::StatusOr<uid_t> peer = PeerUid(fd);
      absl::Status refusal;
      if (!peer.ok()) {
        refusal = peer.status();
      } else if (*peer != own_uid) {
        refusal = absl::PermissionDeniedError(absl::StrCat(
            "user ", *peer, " may not hand regions to a PS of user ", own_uid));
      } else if (static_cast<int>(connections.size()) >= limits_.max_pending) {
        refusal = absl::ResourceExhaustedError(absl::StrCat(
            limits_.max_pending, " region handoffs are pending already; try again"));
      }
      if (!refusal.ok()) {
        refused_.fetch_add(1, std::memory_order_relaxed);
        Answer(fd, refusal);
        close(fd);
        continue;
      }
      connections.push_back({.fd = fd, .deadline = now + limits_.deadline});
    }
  }
  for (const Connection& connection : connections) close(connection.fd);
}

}  // namespace pst
