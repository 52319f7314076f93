#include "rpc/connection_gate.h"

#include <sys/resource.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/rpc/gate_test_client.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using gate_test::Await;
using gate_test::Call;
using gate_test::ChannelTo;
using gate_test::ClosedByServer;
using gate_test::Connect;
using gate_test::Dial;
using gate_test::Heard;
using gate_test::InodeOf;
using gate_test::kNoHandshakeTimeout;
using gate_test::kPatience;
using gate_test::Socket;
using gate_test::StillOpen;

class ConnectionGateTest : public ::testing::Test {
 protected:
  // Starts a server behind a gate with `options`, listening on `address`.
  // Its one service answers every call UNIMPLEMENTED: that answer shows a
  // call reached it.
  void Start(const ConnectionGate::Options& options, const std::string& address = "127.0.0.1:0",
             bool serve = true) {
    absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create(options);
    ASSERT_TRUE(gate.ok()) << gate.status();
    gate_ = *std::move(gate);
    grpc::ServerBuilder builder;
    absl::StatusOr<int> port = gate_->Listen(address, grpc::InsecureServerCredentials(), &builder);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    ASSERT_GT(port_, 0);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    if (serve) gate_->Serve();
  }

  // The gate first, then the server: gRPC drops connections handed to a
  // server shutting down.
  void TearDown() override {
    if (gate_ != nullptr) gate_->Stop();
    if (server_ != nullptr) server_->Shutdown();
  }

  Socket Connect(const char* source = "127.0.0.1") { return gate_test::Connect(port_, source); }

  // Whether the gate closes a new connection from `source` by `deadline`.
  bool NewConnectionClosed(const char* source, absl::Time deadline) {
    return gate_test::ConnectionClosedByServer(port_, source, deadline);
  }

  std::vector<Socket> ConnectMany(int count, const char* source = "127.0.0.1") {
    std::vector<Socket> sockets;
    for (int i = 0; i < count; ++i) sockets.push_back(Connect(source));
    return sockets;
  }

  std::shared_ptr<grpc::Channel> Channel() { return ChannelTo(port_); }

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

  const absl::Time deadline = absl::Now() + kPatience;
  for (int i = 0; i < 15; ++i) EXPECT_TRUE(NewConnectionClosed("127.0.0.1", deadline)) << i;
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
  EXPECT_EQ(gate_->descriptor_shortages(), 0);
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

  EXPECT_TRUE(NewConnectionClosed("127.0.0.2", absl::Now() + kPatience));
  EXPECT_TRUE(NewConnectionClosed("127.0.0.3", absl::Now() + kPatience));
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

// At the total cap the gate accepts nothing: the next connection waits in
// the backlog, unreset, until an admitted one closes.
TEST_F(ConnectionGateTest, AtTheTotalCapConnectionsWaitUntilOneCloses) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 8,
                                 .max_connections_per_source = 100,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  std::vector<Socket> from_1 = ConnectMany(4, "127.0.0.1");
  std::vector<Socket> from_2 = ConnectMany(4, "127.0.0.2");
  ASSERT_TRUE(OpenConnectionsBecome(8));

  // Set up by the kernel once connect() returns: in the backlog.
  const Socket ninth = Connect("127.0.0.3");
  const Socket tenth = Connect("127.0.0.3");
  EXPECT_EQ(Await(ninth, absl::Now()), Heard::kNothing);
  EXPECT_EQ(Await(tenth, absl::Now()), Heard::kNothing);
  EXPECT_EQ(gate_->open_connections(), 8);
  EXPECT_EQ(gate_->refused_over_total(), 0);

  // A connection that closes frees its place, for the first in the backlog.
  from_1.pop_back();
  EXPECT_EQ(Await(ninth, absl::Now() + kPatience), Heard::kData);
  EXPECT_EQ(Await(tenth, absl::Now()), Heard::kNothing);
  EXPECT_EQ(gate_->open_connections(), 8);
  EXPECT_EQ(gate_->refused_over_total(), 1);
  from_2.pop_back();
  EXPECT_EQ(Await(tenth, absl::Now() + kPatience), Heard::kData);
  EXPECT_TRUE(StillOpen(ninth));
  EXPECT_TRUE(OpenConnectionsBecome(8));
  // Both waited for their place; none was reset.
  EXPECT_EQ(gate_->refused_over_total(), 2);
  EXPECT_EQ(gate_->refused_over_source(), 0);
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

TEST_F(ConnectionGateTest, ConnectionsWaitInTheBacklogUntilServe) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 100,
                                 .handshake_timeout = kNoHandshakeTimeout},
                                "127.0.0.1:0", /*serve=*/false));
  const Socket early = Connect();
  EXPECT_EQ(Await(early, absl::Now()), Heard::kNothing);
  EXPECT_EQ(gate_->open_connections(), 0);
  gate_->Serve();
  EXPECT_EQ(Await(early, absl::Now() + kPatience), Heard::kData);
  EXPECT_EQ(gate_->open_connections(), 1);
  gate_->Serve();  // nothing more
  const std::shared_ptr<grpc::Channel> channel = Channel();
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

// Stop() closes the listening socket (the port is free again) but leaves
// the server the connections it has.
TEST_F(ConnectionGateTest, StopClosesTheListenerAndKeepsTheConnections) {
  ASSERT_NO_FATAL_FAILURE(Start({.max_connections = 1000,
                                 .max_connections_per_source = 100,
                                 .handshake_timeout = kNoHandshakeTimeout}));
  const std::shared_ptr<grpc::Channel> channel = Channel();
  ASSERT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  const Socket admitted = Connect();
  ASSERT_EQ(Await(admitted, absl::Now() + kPatience), Heard::kData);

  gate_->Stop();
  gate_->Stop();  // nothing more
  int error = 0;
  const Socket refused = Dial(port_, "127.0.0.1", /*nonblocking=*/false, &error);
  EXPECT_EQ(error, ECONNREFUSED) << strerror(error);
  EXPECT_TRUE(StillOpen(admitted));
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);

  // Neither listens again; another gate may take the port.
  grpc::ServerBuilder builder;
  EXPECT_EQ(gate_->Listen("127.0.0.1:0", grpc::InsecureServerCredentials(), &builder).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::shared_ptr<ConnectionGate>> next = ConnectionGate::Create({});
  ASSERT_TRUE(next.ok());
  const absl::StatusOr<int> port = (*next)->Listen(absl::StrCat("127.0.0.1:", port_),
                                                   grpc::InsecureServerCredentials(), &builder);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, port_);
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

}  // namespace PST_FILE_ID
}  // namespace pst
