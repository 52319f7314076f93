#include "rpc/connection_gate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/support/eventually.h"

namespace pst {
namespace {

// Longer than any test but the handshake timeout's, so that no connection
// the gate admits is closed for want of a handshake while a test runs.
constexpr absl::Duration kNoHandshakeTimeout = absl::Minutes(10);
// How long a test waits for something that should come at once.
constexpr absl::Duration kPatience = absl::Seconds(20);

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
Heard Await(const Socket& socket, absl::Time deadline) {
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
bool ClosedByServer(const Socket& socket, absl::Time deadline) {
  Heard heard;
  while ((heard = Await(socket, deadline)) == Heard::kData) {
  }
  return heard == Heard::kClosed;
}

bool ClosedByServer(const Socket& socket) { return ClosedByServer(socket, absl::Now() + kPatience); }

// Not closed by the server so far.
bool StillOpen(const Socket& socket) { return !ClosedByServer(socket, absl::Now()); }

// The socket or file `fd` names now; 0 if none.
ino_t InodeOf(int fd) {
  struct stat status;
  return fstat(fd, &status) == 0 ? status.st_ino : 0;
}

class ConnectionGateTest : public ::testing::Test {
 protected:
  // Starts a server on 127.0.0.1 behind a gate with `options`. Its one
  // service answers every call UNIMPLEMENTED: that answer shows a call
  // reached it.
  void Start(const ConnectionGate::Options& options) {
    absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create(options);
    ASSERT_TRUE(gate.ok()) << gate.status();
    gate_ = *std::move(gate);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    gate_->InstallOn(&builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  // A TCP connection to the server from `source`, a loopback address.
  Socket Connect(const char* source = "127.0.0.1") {
    Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    EXPECT_GE(socket.fd(), 0) << strerror(errno);
    sockaddr_in from{.sin_family = AF_INET, .sin_port = 0, .sin_addr = {}, .sin_zero = {}};
    inet_pton(AF_INET, source, &from.sin_addr);
    EXPECT_EQ(bind(socket.fd(), reinterpret_cast<const sockaddr*>(&from), sizeof(from)), 0)
        << source << ": " << strerror(errno);
    sockaddr_in to{.sin_family = AF_INET,
                   .sin_port = htons(static_cast<uint16_t>(port_)),
                   .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)},
                   .sin_zero = {}};
    EXPECT_EQ(connect(socket.fd(), reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0)
        << strerror(errno);
    return socket;
  }

  std::vector<Socket> ConnectMany(int count, const char* source = "127.0.0.1") {
    std::vector<Socket> sockets;
    for (int i = 0; i < count; ++i) sockets.push_back(Connect(source));
    return sockets;
  }

  std::shared_ptr<grpc::Channel> Channel() {
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                               grpc::InsecureChannelCredentials());
  }

  // One unary call over `channel`, waited for; with wait_for_ready, the
  // channel tries to connect again while the call's 20 s last.
  static grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
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

  // The descriptors of the server's side of its connections that are still
  // connected: the server and the test's clients share this process.
  std::vector<int> ServerSideDescriptors() const {
    std::vector<int> descriptors;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      const int fd = std::stoi(entry.path().filename().string());
      sockaddr_storage local{}, peer{};
      socklen_t local_length = sizeof(local), peer_length = sizeof(peer);
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) != 0 ||
          getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
        continue;
      }
      int local_port = -1;
      if (local.ss_family == AF_INET) {
        local_port = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
      } else if (local.ss_family == AF_INET6) {
        local_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
      }
      if (local_port == port_) descriptors.push_back(fd);
    }
    return descriptors;
  }

  bool OpenConnectionsBecome(int count) {
    return Eventually([&] { return gate_->open_connections() == count; });
  }

  std::shared_ptr<ConnectionGate> gate_;
  grpc::CallbackGenericService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(ConnectionGateTest, ConnectionsPastThePerSourceCapAreResetAndCounted) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 5,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  std::vector<Socket> admitted = ConnectMany(5);
  ASSERT_TRUE(OpenConnectionsBecome(5));

  std::vector<Socket> refused = ConnectMany(15);
  const absl::Time deadline = absl::Now() + kPatience;
  for (const Socket& socket : refused) EXPECT_TRUE(ClosedByServer(socket, deadline));
  EXPECT_EQ(gate_->refused_over_source(), 15);
  EXPECT_EQ(gate_->refused_over_total(), 0);
  EXPECT_EQ(gate_->open_connections(), 5);
  for (const Socket& socket : admitted) EXPECT_TRUE(StillOpen(socket));

  // Once those close, the source is admitted again, and served. The
  // channel's first try may come before gRPC has closed them all, and be
  // refused; it tries again.
  admitted.clear();
  const std::shared_ptr<grpc::Channel> channel = Channel();
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(OpenConnectionsBecome(1));
  EXPECT_GE(gate_->refused_over_source(), 15);
}

// gRPC closes a connection without a word, and accept() hands its number
// to the next: each connection counts once, however numbers are reused.
TEST_F(ConnectionGateTest, ConnectionsThatComeAndGoCountOnce) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 100,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(round);
    int server_side = -1;
    ino_t inode = 0;
    {
      const Socket socket = Connect();
      ASSERT_EQ(Await(socket, absl::Now() + kPatience), Heard::kData);
      ASSERT_TRUE(OpenConnectionsBecome(1));
      ASSERT_EQ(ServerSideDescriptors().size(), 1u);
      server_side = ServerSideDescriptors()[0];
      inode = InodeOf(server_side);
    }
    // Once gRPC has closed its side too, both ends' numbers are free, and
    // the next round's connection gets them back: its server side reuses
    // this one's number.
    ASSERT_TRUE(Eventually([&] { return InodeOf(server_side) != inode; }));
  }
  EXPECT_TRUE(OpenConnectionsBecome(0));
  EXPECT_EQ(gate_->refused_over_source() + gate_->refused_over_total(), 0);
}

// The number of a connection gRPC has closed goes to another descriptor of
// the process: the connection no longer counts.
TEST_F(ConnectionGateTest, AConnectionWhoseNumberWentElsewhereNoLongerCounts) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 1,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  int closed_number = -1;
  ino_t inode = 0;
  {
    const Socket first = Connect();
    ASSERT_EQ(Await(first, absl::Now() + kPatience), Heard::kData);
    const std::vector<int> server_side = ServerSideDescriptors();
    ASSERT_EQ(server_side.size(), 1u);
    closed_number = server_side[0];
    inode = InodeOf(closed_number);
  }
  ASSERT_TRUE(Eventually([&] { return InodeOf(closed_number) != inode; }));
  // Sockets of the process's own (a metrics scrape, say) take every free
  // number up to that one, so the next connection reuses none the gate
  // knew, and the one it knew now names another socket.
  std::vector<int> own_sockets;
  absl::Cleanup close_own_sockets = [&] {
    for (int fd : own_sockets) close(fd);
  };
  do {
    own_sockets.push_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(own_sockets.back(), 0) << strerror(errno);
  } while (own_sockets.back() < closed_number);

  const Socket second = Connect();
  EXPECT_EQ(Await(second, absl::Now() + kPatience), Heard::kData);
  EXPECT_EQ(gate_->refused_over_source(), 0);
  EXPECT_EQ(gate_->open_connections(), 1);
}

TEST_F(ConnectionGateTest, EachSourceHasItsOwnCap) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 3,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  std::vector<Socket> from_2 = ConnectMany(3, "127.0.0.2");
  std::vector<Socket> from_3 = ConnectMany(3, "127.0.0.3");
  ASSERT_TRUE(OpenConnectionsBecome(6));

  const Socket fourth_from_2 = Connect("127.0.0.2");
  const Socket fourth_from_3 = Connect("127.0.0.3");
  EXPECT_TRUE(ClosedByServer(fourth_from_2));
  EXPECT_TRUE(ClosedByServer(fourth_from_3));
  EXPECT_EQ(gate_->refused_over_source(), 2);
  for (const Socket& socket : from_2) EXPECT_TRUE(StillOpen(socket));
  for (const Socket& socket : from_3) EXPECT_TRUE(StillOpen(socket));

  // A third source is untouched by the other two being full.
  const Socket from_1 = Connect("127.0.0.1");
  EXPECT_TRUE(OpenConnectionsBecome(7));
  EXPECT_TRUE(StillOpen(from_1));
  EXPECT_EQ(gate_->refused_over_source(), 2);
  EXPECT_EQ(gate_->refused_over_total(), 0);
}

TEST_F(ConnectionGateTest, TheTotalCapCountsEverySource) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 8,
                                 .max_connections_per_source = 100,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  std::vector<Socket> from_1 = ConnectMany(4, "127.0.0.1");
  std::vector<Socket> from_2 = ConnectMany(4, "127.0.0.2");
  ASSERT_TRUE(OpenConnectionsBecome(8));

  const Socket ninth = Connect("127.0.0.3");
  EXPECT_TRUE(ClosedByServer(ninth));
  EXPECT_EQ(gate_->refused_over_total(), 1);
  EXPECT_EQ(gate_->refused_over_source(), 0);
  EXPECT_EQ(gate_->open_connections(), 8);

  // A connection that closes frees its place.
  from_1.pop_back();
  ASSERT_TRUE(OpenConnectionsBecome(7));
  const Socket replacement = Connect("127.0.0.3");
  EXPECT_TRUE(OpenConnectionsBecome(8));
  EXPECT_TRUE(StillOpen(replacement));
  EXPECT_EQ(gate_->refused_over_total(), 1);
}

TEST_F(ConnectionGateTest, AConnectionThatNeverHandshakesIsClosedAtTheHandshakeTimeout) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 100,
                                 .handshake_timeout = absl::Seconds(1)}));
  const Socket silent = Connect();
  ASSERT_TRUE(OpenConnectionsBecome(1));
  // gRPC's own timeout is 120 s: only the gate's closes it within 30.
  EXPECT_TRUE(ClosedByServer(silent, absl::Now() + absl::Seconds(30)));
  EXPECT_TRUE(OpenConnectionsBecome(0));
  EXPECT_EQ(gate_->refused_over_source() + gate_->refused_over_total(), 0);
}

TEST_F(ConnectionGateTest, TheServerKeepsItsGateAsLongAsItNeedsIt) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 1,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  const std::weak_ptr<ConnectionGate> gate = gate_;
  gate_.reset();
  {
    const Socket first = Connect();
    EXPECT_EQ(Await(first, absl::Now() + kPatience), Heard::kData);
    const Socket second = Connect();
    EXPECT_TRUE(ClosedByServer(second));
    ASSERT_FALSE(gate.expired());
    EXPECT_EQ(gate.lock()->refused_over_source(), 1);
  }
  // (Closed first: Shutdown() waits up to 20 s for an open connection to
  // answer the PING of gRPC's graceful GOAWAY, which these never do.)
  server_->Shutdown();
  server_.reset();
  EXPECT_TRUE(Eventually([&] { return gate.expired(); }));
}

TEST(ConnectionGateOptionsTest, CapsAndTimeoutMustBePositive) {
  const struct {
    const char* name;
    ConnectionGate::Options options;
  } cases[] = {
      {"no connections", {.max_connections = 0}},
      {"no connections per source", {.max_connections_per_source = 0}},
      {"negative cap", {.max_connections = -1}},
      {"no handshake time", {.handshake_timeout = absl::ZeroDuration()}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(ConnectionGate::Create(c.options).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(ConnectionGate::Create({}).ok());
}

TEST(MaxConnectionsTest, LeavesTheReserveBelowTheRaisedSoftLimit) {
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  const int cap = MaxConnectionsAfterRaisingFileLimit();
  rlimit after;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  if (before.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(after.rlim_cur, before.rlim_max);
  }
  EXPECT_GT(cap, 0);
  EXPECT_LE(static_cast<rlim_t>(cap) + kDescriptorReserve, after.rlim_cur);

  // Each descriptor reserved is one connection fewer, down to the floor.
  EXPECT_EQ(MaxConnectionsAfterRaisingFileLimit(kDescriptorReserve + 100), cap - 100);
  EXPECT_EQ(MaxConnectionsAfterRaisingFileLimit(static_cast<int>(after.rlim_cur)),
            kMinMaxConnections);
}

}  // namespace
}  // namespace pst
