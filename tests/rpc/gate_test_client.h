// The client side of the connection gate's tests (rpc/connection_gate.h):
// raw TCP connections from a chosen loopback source, what the server sends
// on them, and one gRPC call to the gated server.
#ifndef PST_TESTS_RPC_GATE_TEST_CLIENT_H_
#define PST_TESTS_RPC_GATE_TEST_CLIENT_H_

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace pst::gate_test {


// Longer than any test but the handshake timeout's, so that no connection
// the gate admits is closed for want of a handshake while a test runs.
inline constexpr absl::Duration kNoHandshakeTimeout = absl::Minutes(10);
// How long a test waits for something that should come at once.
inline constexpr absl::Duration kPatience = absl::Seconds(20);

// A TCP connection that sends nothing, closed with the object.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

enum class Heard { kNothing, kData, kClosed };

// Waits until `deadline` for the server to send on `socket`: data (its
// HTTP/2 SETTINGS, on a connection it admitted), or end-of-file or a reset
// (on one it closed).
inline Heard Await(const Socket& socket, absl::Time deadline) {
  while (true) {
    pollfd readable{.fd = socket.fd(), .events = POLLIN, .revents = 0};
    const int64_t wait_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int ready = poll(&readable, 1, static_cast<int>(wait_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return Heard::kNothing;
    char buffer[4096];
    const ssize_t received = recv(socket.fd(), buffer, sizeof(buffer), MSG_DONTWAIT);
    if (received > 0) return Heard::kData;
    if (received == 0 || errno == ECONNRESET) return Heard::kClosed;
    if (errno != EAGAIN && errno != EINTR) return Heard::kNothing;
  }
}

// Whether the server closes `socket` by `deadline`, whatever it sends first.
inline bool ClosedByServer(const Socket& socket, absl::Time deadline) {
  Heard heard;
  while ((heard = Await(socket, deadline)) == Heard::kData) {
  }
  return heard == Heard::kClosed;
}

inline bool ClosedByServer(const Socket& socket) {
  return ClosedByServer(socket, absl::Now() + kPatience);
}

// Not closed by the server so far.
inline bool StillOpen(const Socket& socket) { return !ClosedByServer(socket, absl::Now()); }

// The socket or file `fd` names now; 0 if none.
inline ino_t InodeOf(int fd) {
  struct stat status;
  return fstat(fd, &status) == 0 ? status.st_ino : 0;
}

// A socket bound to `source`, a loopback address, connecting (blocking
// unless `nonblocking`) to 127.0.0.1:port; connect()'s errno, 0 if none.
inline Socket Dial(int port, const char* source, bool nonblocking, int* error) {
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0));
  EXPECT_GE(socket.fd(), 0) << strerror(errno);
  // The source port is chosen at connect(), knowing the peer: one chosen
  // at bind() may be a pair still in TIME_WAIT from an earlier connection
  // to a server on the same port (EADDRNOTAVAIL).
  const int one = 1;
  setsockopt(socket.fd(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  sockaddr_in from{.sin_family = AF_INET, .sin_port = 0, .sin_addr = {}, .sin_zero = {}};
  inet_pton(AF_INET, source, &from.sin_addr);
  EXPECT_EQ(bind(socket.fd(), reinterpret_cast<const sockaddr*>(&from), sizeof(from)), 0)
      << source << ": " << strerror(errno);
  sockaddr_in to{.sin_family = AF_INET,
                 .sin_port = htons(static_cast<uint16_t>(port)),
                 .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)},
                 .sin_zero = {}};
  *error = connect(socket.fd(), reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0 ? 0 : errno;
  return socket;
}

// A TCP connection to 127.0.0.1:port from `source`.
inline Socket Connect(int port, const char* source = "127.0.0.1") {
  int error = 0;
  Socket socket = Dial(port, source, /*nonblocking=*/false, &error);
  EXPECT_EQ(error, 0) << strerror(error);
  return socket;
}

// Whether the server closes a new connection from `source` by `deadline`.
// Its reset may come before connect() returns: on a busy machine the
// client can be descheduled between the kernel's handshake and connect()'s
// return, while the server accepts the connection and resets it, and
// connect() then reports the reset (ECONNRESET).
inline bool ConnectionClosedByServer(int port, const char* source, absl::Time deadline) {
  int error = 0;
  const Socket socket = Dial(port, source, /*nonblocking=*/false, &error);
  if (error == ECONNRESET) return true;
  EXPECT_EQ(error, 0) << strerror(error);
  return ClosedByServer(socket, deadline);
}

// `count` connections from `source`, all asked for before any is waited
// for: the server sees them arrive together. Returns once the kernel has
// set up every one (the server may have reset some since).
inline std::vector<Socket> ConnectAtOnce(int port, int count, const char* source) {
  std::vector<Socket> sockets;
  std::vector<pollfd> pending;
  for (int i = 0; i < count; ++i) {
    int error = 0;
    sockets.push_back(Dial(port, source, /*nonblocking=*/true, &error));
    EXPECT_TRUE(error == 0 || error == EINPROGRESS) << strerror(error);
    if (error == EINPROGRESS) pending.push_back({.fd = sockets.back().fd(), .events = POLLOUT, .revents = 0});
  }
  const absl::Time deadline = absl::Now() + kPatience;
  while (!pending.empty() && absl::Now() < deadline) {
    if (poll(pending.data(), pending.size(), 100) < 0 && errno != EINTR) break;
    std::erase_if(pending, [](const pollfd& p) { return p.revents != 0; });
  }
  EXPECT_TRUE(pending.empty()) << pending.size() << " connections still not set up";
  return sockets;
}

inline std::shared_ptr<grpc::Channel> ChannelTo(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

// One unary call over `channel`, waited for; with wait_for_ready, the
// channel tries to connect again while the call's 20 s last.
inline grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  context.set_wait_for_ready(true);
  grpc::Slice payload("ping");
  grpc::ByteBuffer request(&payload, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/pst.test.Nothing/Call", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status call_status) {
                   status = std::move(call_status);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

}  // namespace pst::gate_test

#endif  // PST_TESTS_RPC_GATE_TEST_CLIENT_H_
