#include "rpc/connection_gate.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "grpc/grpc.h"
#include "grpc/support/sync.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/support/channel_arguments.h"

namespace pst {

// gRPC installs no header for its socket mutator: these copy the layout of
// src/core/lib/iomgr/socket_mutator.h in gRPC 1.51.1 (Debian 12's), under
// names of our own. If an upgrade changes it, the gate is never asked, or
// asked wrongly, and ConnectionGateTest fails.
namespace grpc_socket_mutator_abi {

enum FdUsage {
  kClientConnectionUsage,
  kServerListenerUsage,
  kServerConnectionUsage,
};

struct MutateSocketInfo {
  int fd;
  FdUsage usage;
};

struct Vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  bool (*mutate_fd_2)(const MutateSocketInfo* info, grpc_socket_mutator* mutator);
};

struct SocketMutator {
  const Vtable* vtable;
  gpr_refcount refcount;
};

}  // namespace grpc_socket_mutator_abi

namespace abi = grpc_socket_mutator_abi;

// A gRPC socket mutator that shows accepted connections to a gate. gRPC
// counts references to it through the channel arguments that carry it and
// destroys it with the last, so it keeps its gate alive, not the reverse.
class GateSocketMutator {
 public:
  // The mutator with one reference, which ChannelArguments::SetSocketMutator
  // adopts.
  static grpc_socket_mutator* New(std::shared_ptr<ConnectionGate> gate) {
    auto* mutator = new GateSocketMutator(std::move(gate));
    return reinterpret_cast<grpc_socket_mutator*>(mutator);
  }

 private:
  explicit GateSocketMutator(std::shared_ptr<ConnectionGate> gate) : gate_(std::move(gate)) {
    base_.vtable = &kVtable;
    gpr_ref_init(&base_.refcount, 1);
  }

  static GateSocketMutator* From(grpc_socket_mutator* mutator) {
    return reinterpret_cast<GateSocketMutator*>(mutator);
  }

  // Never called: gRPC calls mutate_fd_2 where it is set.
  static bool MutateFd(int /*fd*/, grpc_socket_mutator* /*mutator*/) { return true; }

  static bool MutateFd2(const abi::MutateSocketInfo* info, grpc_socket_mutator* mutator) {
    if (info->usage == abi::kServerConnectionUsage) From(mutator)->gate_->Admit(info->fd);
    // Never false, even for a connection the gate refused: gRPC 1.51 then
    // neither closes the descriptor nor accepts again on that port.
    return true;
  }

  static int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) {
    const ConnectionGate* gate_a = From(a)->gate_.get();
    const ConnectionGate* gate_b = From(b)->gate_.get();
    return (gate_a > gate_b) - (gate_a < gate_b);
  }

  static void Destroy(grpc_socket_mutator* mutator) { delete From(mutator); }

  static constexpr abi::Vtable kVtable = {&MutateFd, &Compare, &Destroy, &MutateFd2};

  // First, so that a pointer to this object is a pointer to what gRPC reads.
  abi::SocketMutator base_;
  std::shared_ptr<ConnectionGate> gate_;
};

static_assert(std::is_standard_layout_v<GateSocketMutator>,
              "gRPC reads a GateSocketMutator through a pointer to its first member");

namespace {

class GateOption : public grpc::ServerBuilderOption {
 public:
  GateOption(std::shared_ptr<ConnectionGate> gate, int handshake_timeout_ms)
      : gate_(std::move(gate)), handshake_timeout_ms_(handshake_timeout_ms) {}

  void UpdateArguments(grpc::ChannelArguments* args) override {
    args->SetSocketMutator(GateSocketMutator::New(gate_));
    args->SetInt(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, handshake_timeout_ms_);
  }
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* /*plugins*/) override {}

 private:
  std::shared_ptr<ConnectionGate> gate_;
  int handshake_timeout_ms_;
};

// The address a connection counts against. gRPC listens on IPv6 sockets
// where it can, even for an IPv4 address, so IPv4 peers arrive as
// ::ffff:a.b.c.d; they count as a.b.c.d, like those of an IPv4 socket.
// A peer already gone has no address: all such count as the source "",
// and gRPC closes them at its first read.
std::string PeerSource(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "";
  char text[INET6_ADDRSTRLEN] = "";
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr, text, sizeof(text));
  } else if (address.ss_family == AF_INET6) {
    const in6_addr& in6 = reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&in6)) {
      inet_ntop(AF_INET, &in6.s6_addr[12], text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &in6, text, sizeof(text));
    }
  } else if (address.ss_family == AF_UNIX) {
    return "unix";
  }
  return text;
}

// Resets a connection gRPC has accepted but not yet read from: gRPC reads
// end-of-file at once and closes the descriptor, which with no linger sends
// RST and frees the socket without a TIME_WAIT.
void Reset(int fd) {
  const linger no_linger{.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_linger, sizeof(no_linger));
  shutdown(fd, SHUT_RDWR);
}

// Descriptors open in this process; `limit` bounds their numbers.
int OpenDescriptors(rlim_t limit) {
  if (DIR* dir = opendir("/proc/self/fd")) {
    int count = 0;
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.' && atoi(entry->d_name) != dirfd(dir)) ++count;
    }
    closedir(dir);
    return count;
  }
  // No /proc (a bare chroot): ask every number.
  int count = 0;
  const int last = static_cast<int>(std::min<rlim_t>(limit, 1 << 20));
  for (int fd = 0; fd < last; ++fd) {
    if (fcntl(fd, F_GETFD) != -1) ++count;
  }
  return count;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ConnectionGate>> ConnectionGate::Create(const Options& options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("the connection cap (max_connections) must be at least 1");
  }
  if (options.max_connections_per_source < 1) {
    return absl::InvalidArgumentError(
        "the per-source connection cap (max_connections_per_source) must be at least 1");
  }
  if (options.handshake_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the handshake timeout must be positive");
  }
  return std::shared_ptr<ConnectionGate>(new ConnectionGate(options));
}

void ConnectionGate::InstallOn(grpc::ServerBuilder* builder) {
  const int64_t timeout_ms = std::clamp<int64_t>(
      absl::ToInt64Milliseconds(options_.handshake_timeout), 1, INT_MAX);
  builder->SetOption(
      std::make_unique<GateOption>(shared_from_this(), static_cast<int>(timeout_ms)));
}

bool ConnectionGate::Admit(int fd) {
  struct stat status;
  if (fstat(fd, &status) != 0) {
    // Not for a descriptor accept() has just returned; a connection the
    // gate could not follow would escape the caps.
    Reset(fd);
    return false;
  }
  std::string source = PeerSource(fd);
  {
    absl::MutexLock lock(&mu_);
    // accept() gave out this number, so the connection it named is closed.
    Forget(fd);
    // Entries of closed connections only ever raise the counts, so a sweep
    // is needed only before refusing.
    if (OverTotal() || OverSource(source)) Sweep();
    if (OverTotal()) {
      ++refused_over_total_;
    } else if (OverSource(source)) {
      ++refused_over_source_;
    } else {
      ++open_per_source_[source];
      connections_.emplace(fd, Connection{status.st_dev, status.st_ino, std::move(source)});
      return true;
    }
  }
  Reset(fd);
  return false;
}

int ConnectionGate::open_connections() {
  absl::MutexLock lock(&mu_);
  Sweep();
  return static_cast<int>(connections_.size());
}

int64_t ConnectionGate::refused_over_total() const {
  absl::MutexLock lock(&mu_);
  return refused_over_total_;
}

int64_t ConnectionGate::refused_over_source() const {
  absl::MutexLock lock(&mu_);
  return refused_over_source_;
}

bool ConnectionGate::OverTotal() const {
  return static_cast<int64_t>(connections_.size()) >= options_.max_connections;
}

bool ConnectionGate::OverSource(const std::string& source) const {
  const auto it = open_per_source_.find(source);
  return it != open_per_source_.end() && it->second >= options_.max_connections_per_source;
}

void ConnectionGate::Sweep() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    struct stat status;
    const Connection& connection = it->second;
    if (fstat(it->first, &status) == 0 && status.st_dev == connection.device &&
        status.st_ino == connection.inode) {
      ++it;
      continue;
    }
    if (--open_per_source_[connection.source] == 0) open_per_source_.erase(connection.source);
    connections_.erase(it++);
  }
}

void ConnectionGate::Forget(int fd) {
  const auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  if (--open_per_source_[it->second.source] == 0) open_per_source_.erase(it->second.source);
  connections_.erase(it);
}

int MaxConnectionsAfterRaisingFileLimit(int reserve) {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return kMinMaxConnections;
  const int open = OpenDescriptors(limit.rlim_cur);
  if (limit.rlim_cur < limit.rlim_max) {
    const rlimit raised{.rlim_cur = limit.rlim_max, .rlim_max = limit.rlim_max};
    // Fails for an unlimited hard limit (above fs.nr_open): the soft one stays.
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  const int64_t soft = std::min<rlim_t>(limit.rlim_cur, INT_MAX);
  return static_cast<int>(std::max<int64_t>(soft - reserve - open, kMinMaxConnections));
}

}  // namespace pst
