// ConnectionGate::Listen: the addresses it takes, a port in use, and a
// socket file (rpc/listening_sockets.h makes the sockets).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/server_ports.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "rpc/connection_gate.h"
#include "tests/rpc/gate_test_client.h"

namespace pst {
namespace PST_FILE_ID {

using gate_test::Call;
using gate_test::kNoHandshakeTimeout;
using gate_test::Socket;

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

// Third hostile pass: in a folder any user could write to, another user
// renamed the PS's socket, listened at its path and read the next client's
// token. Such a folder is refused, unless sticky (as /tmp), where the
// socket cannot be renamed by others.
TEST(ConnectionGateSocketPathTest, RefusesAFolderOthersCanWriteToUnlessSticky) {
  const ScratchDir dir;
  const std::string shared = dir.File("shared");
  std::filesystem::create_directories(shared);
  const auto listen = [](const std::string& address) {
    absl::StatusOr<std::shared_ptr<ConnectionGate>> gate = ConnectionGate::Create({});
    grpc::ServerBuilder builder;
    const absl::Status status =
        (*gate)->Listen(address, grpc::InsecureServerCredentials(), &builder).status();
    (*gate)->Stop();
    return status;
  };
  ASSERT_EQ(chmod(shared.c_str(), 0777), 0);
  absl::Status status = listen("unix:" + shared + "/ps.sock");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("can be written by any user"), std::string::npos) << status;
  EXPECT_FALSE(std::filesystem::exists(shared + "/ps.sock"));
  ASSERT_EQ(chmod(shared.c_str(), 01777), 0);
  EXPECT_TRUE(listen("unix:" + shared + "/ps.sock").ok());
  ASSERT_EQ(chmod(shared.c_str(), 0700), 0);
  EXPECT_TRUE(listen("unix:" + shared + "/ps.sock").ok());
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
    EXPECT_GE(*port, kFirstServerPort);
    // Outside the range outgoing connections take their ports from, so
    // that a restart on it finds it free.
    const auto [low, high] = EphemeralPortRange();
    EXPECT_TRUE(*port < low || *port > high) << *port;
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

}  // namespace PST_FILE_ID
}  // namespace pst
