// ConnectionGate under bursts of connections, with a server process of
// its own whose descriptor limit is low.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "rpc/connection_gate.h"
#include "tests/rpc/gate_test_client.h"
#include "tests/support/eventually.h"

extern char** environ;

namespace pst {
namespace PST_FILE_ID {

using gate_test::Call;
using gate_test::ChannelTo;
using gate_test::ConnectAtOnce;
using gate_test::kNoHandshakeTimeout;
using gate_test::kPatience;
using gate_test::Socket;

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

}  // namespace PST_FILE_ID
}  // namespace pst
