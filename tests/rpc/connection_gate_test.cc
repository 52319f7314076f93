#include "rpc/connection_gate.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
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

extern char** environ;

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

// A socket bound to `source`, a loopback address, connecting (blocking
// unless `nonblocking`) to 127.0.0.1:port; connect()'s errno, 0 if none.
Socket Dial(int port, const char* source, bool nonblocking, int* error) {
  Socket socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0));
  EXPECT_GE(socket.fd(), 0) << strerror(errno);
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
Socket Connect(int port, const char* source = "127.0.0.1") {
  int error = 0;
  Socket socket = Dial(port, source, /*nonblocking=*/false, &error);
  EXPECT_EQ(error, 0) << strerror(error);
  return socket;
}

// `count` connections from `source`, all asked for before any is waited
// for: the server sees them arrive together. Returns once the kernel has
// set up every one (the server may have reset some since).
std::vector<Socket> ConnectAtOnce(int port, int count, const char* source) {
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

std::shared_ptr<grpc::Channel> ChannelTo(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

// One unary call over `channel`, waited for; with wait_for_ready, the
// channel tries to connect again while the call's 20 s last.
grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
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

  Socket Connect(const char* source = "127.0.0.1") { return pst::Connect(port_, source); }

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

// Without SO_REUSEPORT: a second server started for the same shard would
// otherwise listen beside the first, and the kernel split the connections.
TEST(ConnectionGateListenTest, APortInUseIsUnavailable) {
  absl::StatusOr<std::shared_ptr<ConnectionGate>> first = ConnectionGate::Create({});
  absl::StatusOr<std::shared_ptr<ConnectionGate>> second = ConnectionGate::Create({});
  ASSERT_TRUE(first.ok() && second.ok());
  grpc::ServerBuilder first_builder, second_builder;
  const absl::StatusOr<int> port =
      (*first)->Listen("127.0.0.1:0", grpc::InsecureServerCredentials(), &first_builder);
  ASSERT_TRUE(port.ok()) << port.status();
  for (const std::string& address : {absl::StrCat("127.0.0.1:", *port), absl::StrCat("0.0.0.0:", *port),
                                    absl::StrCat("[::]:", *port)}) {
    SCOPED_TRACE(address);
    const absl::Status status =
        (*second)->Listen(address, grpc::InsecureServerCredentials(), &second_builder).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(status.message().find("cannot listen on " + address), std::string::npos) << status;
    EXPECT_NE(status.message().find(strerror(EADDRINUSE)), std::string::npos) << status;
    EXPECT_NE(status.message().find("port in use"), std::string::npos) << status;
  }
  EXPECT_EQ((*first)->Listen("127.0.0.1:0", grpc::InsecureServerCredentials(), &first_builder)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// A scratch folder for socket files, removed with the object.
class ScratchDir {
 public:
  ScratchDir()
      : path_(std::filesystem::temp_directory_path() /
              absl::StrCat("gate_test_", getpid(), "_",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

TEST(ConnectionGateSocketPathTest, ServesAtAFileOnlyThisUserReachesAndRemovesIt) {
  const ScratchDir dir;
  const std::string path = dir.File("ps.sock");
  absl::StatusOr<std::shared_ptr<ConnectionGate>> gate =
      ConnectionGate::Create({.handshake_timeout = kNoHandshakeTimeout});
  ASSERT_TRUE(gate.ok());
  grpc::ServerBuilder builder;
  const absl::StatusOr<int> port =
      (*gate)->Listen("unix:" + path, grpc::InsecureServerCredentials(), &builder);
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, 0);
  struct stat file;
  ASSERT_EQ(stat(path.c_str(), &file), 0);
  EXPECT_TRUE(S_ISSOCK(file.st_mode));
  EXPECT_EQ(file.st_mode & 0777, 0600u);
  grpc::CallbackGenericService service;
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*gate)->Serve();
  // The call reached the server (its service answers every call so). The channel outlives the
  // count: its connection stays open until the channel goes.
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ((*gate)->open_connections(), 1);
  (*gate)->Stop();
  server->Shutdown();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(ConnectionGateSocketPathTest, ReplacesOnlyASocketNobodyAcceptsOn) {
  const ScratchDir dir;
  const std::string path = dir.File("ps.sock");
  const auto listen = [](const std::string& address) {
    absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create({});
    grpc::ServerBuilder builder;
    const absl::Status status =
        (*gate)->Listen(address, grpc::InsecureServerCredentials(), &builder).status();
    return std::make_pair(*std::move(gate), status);
  };
  // A socket file a server left behind: bound, and its socket closed.
  {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    memcpy(address.sun_path, path.data(), path.size());
    const Socket left(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(bind(left.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  auto [first, first_status] = listen("unix:" + path);
  EXPECT_TRUE(first_status.ok()) << first_status;
  // While it listens, a second server is refused the path.
  auto [second, second_status] = listen("unix:" + path);
  EXPECT_EQ(second_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second_status.message().find("another server listens on it"), std::string::npos)
      << second_status;
  second->Stop();
  EXPECT_TRUE(std::filesystem::exists(path)) << "the refused gate removed the first one's socket";
  first->Stop();
  EXPECT_FALSE(std::filesystem::exists(path));
  // A file of another kind is left alone.
  const std::string plain = dir.File("notes.txt");
  { std::ofstream(plain) << "keep\n"; }
  auto [third, third_status] = listen("unix:" + plain);
  EXPECT_EQ(third_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(third_status.message().find("not a socket"), std::string::npos) << third_status;
  EXPECT_TRUE(std::filesystem::exists(plain));
}

bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 loopback{};
  loopback.sin6_family = AF_INET6;
  loopback.sin6_addr = in6addr_loopback;
  const bool bound = bind(fd, reinterpret_cast<const sockaddr*>(&loopback), sizeof(loopback)) == 0;
  close(fd);
  return bound;
}

// Whether a TCP connection to `host` (an IP address) and `port` is set up.
bool Reachable(const char* host, int port) {
  sockaddr_storage to{};
  socklen_t length = 0;
  if (inet_pton(AF_INET, host, &reinterpret_cast<sockaddr_in*>(&to)->sin_addr) == 1) {
    to.ss_family = AF_INET;
    reinterpret_cast<sockaddr_in*>(&to)->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host, &reinterpret_cast<sockaddr_in6*>(&to)->sin6_addr) == 1) {
    to.ss_family = AF_INET6;
    reinterpret_cast<sockaddr_in6*>(&to)->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  const Socket socket(::socket(to.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  return connect(socket.fd(), reinterpret_cast<const sockaddr*>(&to), length) == 0;
}

TEST(ConnectionGateListenTest, TakesTheAddressesGrpcTakes) {
  const bool ipv6 = HasIpv6Loopback();
  const struct {
    std::string address;
    std::vector<const char*> reachable_on;
  } cases[] = {
      {"127.0.0.1:0", {"127.0.0.1"}},
      {"localhost:0", {"127.0.0.1"}},
      {"0.0.0.0:0", ipv6 ? std::vector<const char*>{"127.0.0.1", "::1"}
                         : std::vector<const char*>{"127.0.0.1"}},
      {"[::]:0", ipv6 ? std::vector<const char*>{"127.0.0.1", "::1"}
                      : std::vector<const char*>{"127.0.0.1"}},
      {":0", {"127.0.0.1"}},
      {ipv6 ? "[::1]:0" : "127.0.0.1:0", {ipv6 ? "::1" : "127.0.0.1"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.address);
    absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create({});
    ASSERT_TRUE(gate.ok());
    grpc::ServerBuilder builder;
    const absl::StatusOr<int> port =
        (*gate)->Listen(c.address, grpc::InsecureServerCredentials(), &builder);
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_GT(*port, 0);
    // Set up by the kernel, in the backlog: nothing serves them.
    for (const char* host : c.reachable_on) EXPECT_TRUE(Reachable(host, *port)) << host;
  }
  for (const char* address : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:65536",
                              "127.0.0.1:-1", "::1:0", "[::1:0", "10.255.255.1:0"}) {
    SCOPED_TRACE(address);
    absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create({});
    ASSERT_TRUE(gate.ok());
    grpc::ServerBuilder builder;
    const absl::Status status =
        (*gate)->Listen(address, grpc::InsecureServerCredentials(), &builder).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find(absl::StrCat("cannot listen on ", address, ": ")),
              std::string::npos)
        << status;
  }
}

// The burst tests run the server in a child process of this binary with a
// low descriptor limit, while this process holds the connections.
//
// In the child, the environment variable kServerProcess holds
// "<command fd> <reply fd> <soft RLIMIT_NOFILE> <max_connections>
// <max_connections_per_source>". It writes its port to the reply pipe, then
// for every 's' read from the command pipe a line "<open> <over total>
// <over source> <shortages>"; at end-of-file it exits.
constexpr char kServerProcess[] = "PST_CONNECTION_GATE_TEST_SERVER_PROCESS";

int RunServerProcess(const char* spec) {
  int command_fd = -1, reply_fd = -1, max_connections = 0, per_source = 0;
  long long nofile = 0;
  if (sscanf(spec, "%d %d %lld %d %d", &command_fd, &reply_fd, &nofile, &max_connections,
             &per_source) != 5) {
    return 2;
  }
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 3;
  limit.rlim_cur = static_cast<rlim_t>(nofile);
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 3;
  absl::StatusOr<std::shared_ptr<ConnectionGate>> gate =
      ConnectionGate::Create({.max_connections = max_connections,
                              .max_connections_per_source = per_source,
                              .handshake_timeout = kNoHandshakeTimeout});
  if (!gate.ok()) return 4;
  grpc::ServerBuilder builder;
  const absl::StatusOr<int> port =
      (*gate)->Listen("127.0.0.1:0", grpc::InsecureServerCredentials(), &builder);
  if (!port.ok()) return 5;
  grpc::CallbackGenericService service;
  builder.RegisterCallbackGenericService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return 6;
  (*gate)->Serve();
  dprintf(reply_fd, "%d\n", *port);
  char command = 0;
  while (read(command_fd, &command, 1) == 1) {
    dprintf(reply_fd, "%d %lld %lld %lld\n", (*gate)->open_connections(),
            static_cast<long long>((*gate)->refused_over_total()),
            static_cast<long long>((*gate)->refused_over_source()),
            static_cast<long long>((*gate)->descriptor_shortages()));
  }
  (*gate)->Stop();
  // Without shutting the server down: that waits for idle connections to
  // answer gRPC's GOAWAY PING.
  return 0;
}

// Before main(): in the child, run the server and exit; elsewhere, nothing.
[[maybe_unused]] const bool kIsServerProcess = [] {
  const char* spec = getenv(kServerProcess);
  if (spec != nullptr) _exit(RunServerProcess(spec));
  return false;
}();

class ServerProcess {
 public:
  struct Stats {
    int open = -1;
    int64_t over_total = -1;
    int64_t over_source = -1;
    int64_t shortages = -1;
  };

  // This binary as a server process with those limits; null (after a
  // failed expectation) if it did not start.
  static std::unique_ptr<ServerProcess> Start(int nofile, int max_connections, int per_source) {
    int command[2], reply[2];
    if (pipe2(command, O_CLOEXEC) != 0 || pipe2(reply, O_CLOEXEC) != 0) {
      ADD_FAILURE() << strerror(errno);
      return nullptr;
    }
    std::vector<std::string> environment;
    for (char** variable = environ; *variable != nullptr; ++variable) {
      if (std::string(*variable).rfind(absl::StrCat(kServerProcess, "="), 0) != 0) {
        environment.push_back(*variable);
      }
    }
    environment.push_back(absl::StrCat(kServerProcess, "=", command[0], " ", reply[1], " ", nofile,
                                       " ", max_connections, " ", per_source));
    std::vector<char*> envp;
    for (std::string& variable : environment) envp.push_back(variable.data());
    envp.push_back(nullptr);
    char program[] = "/proc/self/exe";
    char* argv[] = {program, nullptr};

    std::unique_ptr<ServerProcess> process(new ServerProcess);
    process->pid_ = fork();
    if (process->pid_ == 0) {
      // Only async-signal-safe calls here: the parent has threads.
      fcntl(command[0], F_SETFD, 0);
      fcntl(reply[1], F_SETFD, 0);
      execve(program, argv, envp.data());
      _exit(127);
    }
    close(command[0]);
    close(reply[1]);
    process->command_fd_ = command[1];
    process->reply_fd_ = reply[0];
    if (process->pid_ < 0) {
      ADD_FAILURE() << "fork: " << strerror(errno);
      return nullptr;
    }
    const std::optional<std::string> port = process->ReadLine();
    if (!port.has_value() || sscanf(port->c_str(), "%d", &process->port_) != 1 ||
        process->port_ <= 0) {
      ADD_FAILURE() << "the server process did not start";
      return nullptr;
    }
    return process;
  }

  // Tells it to stop, and waits for it (kills it if it does not stop).
  ~ServerProcess() {
    if (command_fd_ >= 0) close(command_fd_);
    if (reply_fd_ >= 0) close(reply_fd_);
    if (pid_ <= 0) return;
    int status = 0;
    if (!Eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; })) {
      ADD_FAILURE() << "the server process did not stop";
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      return;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  }

  int port() const { return port_; }

  // The gate's counters now; -1 each if the process does not answer.
  Stats stats() {
    Stats stats;
    if (write(command_fd_, "s", 1) != 1) return stats;
    const std::optional<std::string> line = ReadLine();
    long long over_total = -1, over_source = -1, shortages = -1;
    if (!line.has_value() || sscanf(line->c_str(), "%d %lld %lld %lld", &stats.open, &over_total,
                                    &over_source, &shortages) != 4) {
      return Stats();
    }
    stats.over_total = over_total;
    stats.over_source = over_source;
    stats.shortages = shortages;
    return stats;
  }

 private:
  ServerProcess() = default;

  // A line from the reply pipe, within kPatience.
  std::optional<std::string> ReadLine() {
    const absl::Time deadline = absl::Now() + kPatience;
    while (true) {
      if (const size_t end = buffered_.find('\n'); end != std::string::npos) {
        std::string line = buffered_.substr(0, end);
        buffered_.erase(0, end + 1);
        return line;
      }
      pollfd readable{.fd = reply_fd_, .events = POLLIN, .revents = 0};
      const int64_t wait_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (wait_ms <= 0) return std::nullopt;
      const int ready = poll(&readable, 1, static_cast<int>(wait_ms));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return std::nullopt;
      char buffer[256];
      const ssize_t received = read(reply_fd_, buffer, sizeof(buffer));
      if (received < 0 && errno == EINTR) continue;
      if (received <= 0) return std::nullopt;
      buffered_.append(buffer, static_cast<size_t>(received));
    }
  }

  pid_t pid_ = -1;
  int command_fd_ = -1;
  int reply_fd_ = -1;
  int port_ = 0;
  std::string buffered_;
};

// Raises this process's soft descriptor limit to at least `needed`; false
// if the hard limit is lower.
bool AllowDescriptors(rlim_t needed) {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  if (limit.rlim_cur >= needed) return true;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed) return false;
  limit.rlim_cur = needed;
  return setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

// What broke gRPC's own accept loop (1.51): it accepts every connection
// waiting before it closes any, so a burst of them ran a server with few
// descriptors out of them; accept4 failed with EMFILE, and the listener
// never accepted again.
TEST(ConnectionGateBurstTest, ABurstOfIdleConnectionsLeavesTheServerServing) {
  constexpr int kBurst = 1100;
  if (!AllowDescriptors(kBurst + 256)) GTEST_SKIP() << "the hard RLIMIT_NOFILE is too low";
  const std::unique_ptr<ServerProcess> server =
      ServerProcess::Start(/*nofile=*/128, /*max_connections=*/32, /*per_source=*/16);
  ASSERT_NE(server, nullptr);

  const std::vector<Socket> burst = ConnectAtOnce(server->port(), kBurst, "127.0.0.2");
  ServerProcess::Stats stats;
  EXPECT_TRUE(Eventually([&] {
    stats = server->stats();
    return stats.over_source == kBurst - 16;
  })) << stats.over_source;
  EXPECT_EQ(stats.open, 16);
  EXPECT_EQ(stats.over_total, 0);
  EXPECT_EQ(stats.shortages, 0);

  const std::shared_ptr<grpc::Channel> channel = ChannelTo(server->port());
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  stats = server->stats();
  EXPECT_EQ(stats.open, 17);
  EXPECT_EQ(stats.over_source, kBurst - 16);
  EXPECT_EQ(stats.over_total, 0);
}

// Caps that leave too few descriptors: the gate runs out, waits, and
// accepts again once connections close.
TEST(ConnectionGateBurstTest, RunningOutOfDescriptorsLeavesTheListenerListening) {
  constexpr int kHeld = 300;
  if (!AllowDescriptors(kHeld + 256)) GTEST_SKIP() << "the hard RLIMIT_NOFILE is too low";
  const std::unique_ptr<ServerProcess> server =
      ServerProcess::Start(/*nofile=*/128, /*max_connections=*/1000, /*per_source=*/1000);
  ASSERT_NE(server, nullptr);

  std::vector<Socket> held = ConnectAtOnce(server->port(), kHeld, "127.0.0.2");
  ServerProcess::Stats stats;
  EXPECT_TRUE(Eventually([&] {
    stats = server->stats();
    return stats.shortages > 0;
  }));
  EXPECT_GT(stats.open, 0);
  EXPECT_LT(stats.open, 128);
  EXPECT_EQ(stats.over_source + stats.over_total, 0);

  held.clear();
  const std::shared_ptr<grpc::Channel> channel = ChannelTo(server->port());
  EXPECT_EQ(Call(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  // Every one of those accepted, seen closed and forgotten: only the
  // channel's is left.
  EXPECT_TRUE(Eventually([&] {
    stats = server->stats();
    return stats.open == 1;
  })) << stats.open;
  EXPECT_EQ(stats.over_source + stats.over_total, 0);
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
