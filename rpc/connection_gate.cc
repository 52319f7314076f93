#include "rpc/connection_gate.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "rpc/connection_source.h"

namespace pst {
namespace {

// Connections waiting to be accepted that each listening socket holds
// (the kernel caps it at net.core.somaxconn).
constexpr int kBacklog = 1024;
// How long the gate waits before it looks again whether a connection has
// closed (at the total cap), or tries again to accept (after a shortage).
constexpr int kRetryMs = 50;
// Connections accepted from one listener before the gate looks at the
// others and at Stop().
constexpr int kBatch = 64;
// How often the gate logs that it cannot accept, at most.
constexpr absl::Duration kLogEvery = absl::Seconds(10);

// Closes a connection with a reset: the peer learns at once, and the
// socket is freed without a TIME_WAIT.
void Reset(int fd) {
  const linger no_linger{.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_linger, sizeof(no_linger));
  close(fd);
}

void SetInt(int fd, int level, int option, int value) {
  setsockopt(fd, level, option, &value, sizeof(value));
}

std::string ErrnoText(const char* call, int error) { return absl::StrCat(call, ": ", strerror(error)); }

// A socket listening on `address` (its port 0 picks one), or -1 and why not.
struct Listening {
  int fd = -1;
  int error = 0;
  const char* call = "";
};

Listening ListenOn(const sockaddr* address, socklen_t length, bool dual_stack) {
  const int fd = socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return {.fd = -1, .error = errno, .call = "socket"};
  // REUSEADDR lets a restarted server bind beside its predecessor's
  // TIME_WAIT connections, but not beside a socket that still listens.
  // No REUSEPORT: with it, a second server would listen beside the first,
  // and the kernel would split the connections between them.
  SetInt(fd, SOL_SOCKET, SO_REUSEADDR, 1);
  if (address->sa_family == AF_INET6) SetInt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual_stack ? 0 : 1);
  // Inherited by the accepted connections, as from gRPC's own listeners.
  SetInt(fd, IPPROTO_TCP, TCP_NODELAY, 1);
  const char* call = "bind";
  if (bind(fd, address, length) == 0) {
    call = "listen";
    if (listen(fd, kBacklog) == 0) return {.fd = fd};
  }
  const int error = errno;
  close(fd);
  return {.fd = -1, .error = error, .call = call};
}

// A socket listening at the filesystem path `path` (an AF_UNIX stream
// socket), reachable only by those whom the file's mode (0600: this user)
// and its folders admit; or why not. A socket file left by a server that
// is gone (nothing accepts on it) is replaced; one that still serves, or a
// file of another kind, is left alone.
absl::StatusOr<int> ListenOnPath(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::UnavailableError(
        absl::StrCat("a socket path must have 1 to ", sizeof(address.sun_path) - 1, " bytes"));
  }
  memcpy(address.sun_path, path.data(), path.size());
  const auto* named = reinterpret_cast<const sockaddr*>(&address);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(ErrnoText("socket", errno));
  int bound = bind(fd, named, sizeof(address));
  if (bound != 0 && errno == EADDRINUSE) {
    struct stat existing;
    if (lstat(path.c_str(), &existing) == 0 && !S_ISSOCK(existing.st_mode)) {
      close(fd);
      return absl::UnavailableError("the path exists and is not a socket");
    }
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool served = probe >= 0 && connect(probe, named, sizeof(address)) == 0;
    const int refused = errno;
    if (probe >= 0) close(probe);
    if (served || refused != ECONNREFUSED) {
      close(fd);
      return absl::UnavailableError("another server listens on it");
    }
    unlink(path.c_str());
    bound = bind(fd, named, sizeof(address));
  }
  // Nobody can connect before listen(): the mode is set first.
  const char* call = "bind";
  if (bound == 0) {
    call = "chmod";
    if (chmod(path.c_str(), 0600) == 0) {
      call = "listen";
      if (listen(fd, kBacklog) == 0) return fd;
    }
  }
  const int error = errno;
  close(fd);
  if (bound == 0) unlink(path.c_str());
  return absl::UnavailableError(ErrnoText(call, error));
}

int PortOf(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  return 0;
}

void SetPort(sockaddr_storage* address, int port) {
  if (address->ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (address->ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

struct Endpoint {
  sockaddr_storage address;
  socklen_t length;
  bool dual_stack;
};

// The addresses to listen on for "host:port", as gRPC's server would: every
// address the host resolves to; for a wildcard host, [::] on IPv4 and IPv6
// together, or 0.0.0.0 where the host has no IPv6.
absl::StatusOr<std::vector<Endpoint>> Resolve(const std::string& address) {
  std::string host;
  std::string port_text;
  if (address.size() > 0 && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || address.compare(close + 1, 1, ":") != 0) {
      return absl::UnavailableError("not host:port");
    }
    host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return absl::UnavailableError("no port");
    host = address.substr(0, colon);
    if (host.find(':') != std::string::npos) {
      return absl::UnavailableError("an IPv6 address needs brackets: [v6]:port");
    }
    port_text = address.substr(colon + 1);
  }
  int port = -1;
  if (port_text.empty() || !std::all_of(port_text.begin(), port_text.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::UnavailableError(absl::StrCat("bad port \"", port_text, "\""));
  }

  std::vector<Endpoint> endpoints;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    Endpoint any6{.address = {}, .length = sizeof(sockaddr_in6), .dual_stack = true};
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&any6.address);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    Endpoint any4{.address = {}, .length = sizeof(sockaddr_in), .dual_stack = false};
    auto* in4 = reinterpret_cast<sockaddr_in*>(&any4.address);
    in4->sin_family = AF_INET;
    in4->sin_addr.s_addr = htonl(INADDR_ANY);
    endpoints = {any6, any4};  // the second only if the first fails for want of IPv6
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (const int error = getaddrinfo(host.c_str(), "0", &hints, &found); error != 0) {
      return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(error)));
    }
    for (const addrinfo* info = found; info != nullptr; info = info->ai_next) {
      if ((info->ai_family != AF_INET && info->ai_family != AF_INET6) ||
          info->ai_addrlen > sizeof(sockaddr_storage)) {
        continue;
      }
      Endpoint endpoint{.address = {}, .length = info->ai_addrlen, .dual_stack = false};
      memcpy(&endpoint.address, info->ai_addr, info->ai_addrlen);
      const bool seen = std::any_of(endpoints.begin(), endpoints.end(), [&](const Endpoint& e) {
        return e.length == endpoint.length && memcmp(&e.address, &endpoint.address, e.length) == 0;
      });
      if (!seen) endpoints.push_back(endpoint);
    }
    freeaddrinfo(found);
    if (endpoints.empty()) return absl::UnavailableError(absl::StrCat(host, " has no IP address"));
  }
  for (Endpoint& endpoint : endpoints) SetPort(&endpoint.address, port);
  return endpoints;
}

bool IsShortage(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

// accept4 errors after which the next connection may be accepted at once:
// this one's peer gave up, or (Linux) a network error already pending on it.
bool IsTransient(int error) {
  return error == EINTR || error == EAGAIN || error == EWOULDBLOCK || error == ECONNABORTED ||
         error == EPROTO || error == EPERM || error == ENETDOWN || error == ENOPROTOOPT ||
         error == EHOSTDOWN || error == ENONET || error == EHOSTUNREACH || error == EOPNOTSUPP ||
         error == ENETUNREACH;
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

ConnectionGate::~ConnectionGate() { Stop(); }

absl::StatusOr<int> ConnectionGate::Listen(const std::string& address,
                                           std::shared_ptr<grpc::ServerCredentials> credentials,
                                           grpc::ServerBuilder* builder) {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  if (stopped_ || !listeners_.empty()) {
    return absl::FailedPreconditionError("a connection gate listens once, before it is stopped");
  }
  const auto unavailable = [&address](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", why,
                                               "; is the port in use or the address not on this "
                                               "host?"));
  };
  if (absl::StartsWith(address, "unix:")) {
    const std::string path = address.substr(5);
    absl::StatusOr<int> listener = ListenOnPath(path);
    if (!listener.ok()) return unavailable(listener.status().message());
    struct stat socket_file;
    if (stat(path.c_str(), &socket_file) == 0) {
      socket_path_ = path;
      socket_file_ = {.device = socket_file.st_dev, .inode = socket_file.st_ino, .source = ""};
    }
    return Admit({*listener}, /*port=*/0, credentials, builder);
  }
  absl::StatusOr<std::vector<Endpoint>> endpoints = Resolve(address);
  if (!endpoints.ok()) return unavailable(endpoints.status().message());

  std::vector<int> listeners;
  std::vector<std::string> errors;
  bool in_use = false;
  int port = 0;
  const bool wildcard = endpoints->front().dual_stack;
  for (Endpoint& endpoint : *endpoints) {
    // Every address on the port the first got, as gRPC does for port 0.
    if (port != 0) SetPort(&endpoint.address, port);
    const Listening listening = ListenOn(reinterpret_cast<const sockaddr*>(&endpoint.address),
                                         endpoint.length, endpoint.dual_stack);
    if (listening.fd >= 0) {
      listeners.push_back(listening.fd);
      if (port == 0) port = PortOf(listening.fd);
      // A dual-stack [::] takes IPv4 too: 0.0.0.0 is its fallback only.
      if (wildcard) break;
      continue;
    }
    errors.push_back(ErrnoText(listening.call, listening.error));
    // The wildcard falls back to IPv4 for want of IPv6, not for a port in use.
    if (listening.error == EADDRINUSE) {
      in_use = true;
      break;
    }
  }
  // Like gRPC, some of a name's addresses suffice (where the host has no
  // IPv6, say); unlike it, not if another server has the port on another:
  // the two would split the connections between them.
  if (listeners.empty() || port == 0 || in_use) {
    for (int fd : listeners) close(fd);
    return unavailable(absl::StrJoin(errors, "; "));
  }
  return Admit(std::move(listeners), port, std::move(credentials), builder);
}

absl::StatusOr<int> ConnectionGate::Admit(std::vector<int> listeners, int port,
                                          std::shared_ptr<grpc::ServerCredentials> credentials,
                                          grpc::ServerBuilder* builder) {
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int error = errno;
    for (int fd : listeners) close(fd);
    RemoveSocketFile();
    return absl::UnavailableError(ErrnoText("eventfd", error));
  }
  listeners_ = std::move(listeners);
  wake_fd_ = wake_fd;
  acceptor_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      std::move(credentials));
  const int64_t timeout_ms = std::clamp<int64_t>(
      absl::ToInt64Milliseconds(options_.handshake_timeout), 1, INT_MAX);
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(timeout_ms));
  return port;
}

void ConnectionGate::Serve() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  if (stopped_ || listeners_.empty() || thread_.joinable()) return;
  thread_ = std::thread([this] { AcceptLoop(); });
}

void ConnectionGate::Stop() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    // An eventfd's counter cannot overflow from one write.
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : listeners_) close(fd);
  listeners_.clear();
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
  RemoveSocketFile();
}

void ConnectionGate::RemoveSocketFile() {
  // Only the file this gate made: a later server's socket at the same
  // path is another inode.
  struct stat now;
  if (!socket_path_.empty() && stat(socket_path_.c_str(), &now) == 0 &&
      now.st_dev == socket_file_.device && now.st_ino == socket_file_.inode) {
    unlink(socket_path_.c_str());
  }
  socket_path_.clear();
}

void ConnectionGate::AcceptLoop() {
  waited_.assign(listeners_.size(), false);
  std::vector<pollfd> polled;
  bool pausing = false;   // after a shortage
  bool was_full = false;  // at the last look
  while (true) {
    bool full;
    {
      absl::MutexLock lock(&mu_);
      // Entries of closed connections only ever raise the count: a sweep is
      // needed only at the cap.
      if (OverTotal()) Sweep();
      full = OverTotal();
    }
    // A place has come free: what waits now has waited for it. The cap may
    // have been reached and left since the last look (another thread's
    // sweep found a connection closed): reached_cap_ says it was.
    if ((was_full || reached_cap_) && !full) NoteWaiting();
    was_full = full;
    reached_cap_ = false;
    const bool accepting = !full && !pausing;
    polled.clear();
    polled.push_back({.fd = wake_fd_, .events = POLLIN, .revents = 0});
    if (accepting) {
      for (int listener : listeners_) polled.push_back({.fd = listener, .events = POLLIN, .revents = 0});
    }
    const int ready = poll(polled.data(), polled.size(), accepting ? -1 : kRetryMs);
    if (ready < 0) {
      if (errno == EINTR) continue;
      // Not for valid descriptors; never spin.
      pausing = true;
      continue;
    }
    if (polled[0].revents != 0) return;  // Stop()
    pausing = false;
    for (size_t i = 1; i < polled.size(); ++i) {
      if (polled[i].revents != 0 && !AcceptFrom(i - 1)) {
        pausing = true;
        break;
      }
    }
  }
}

void ConnectionGate::NoteWaiting() {
  std::vector<pollfd> polled;
  for (int listener : listeners_) polled.push_back({.fd = listener, .events = POLLIN, .revents = 0});
  if (poll(polled.data(), polled.size(), 0) < 0) return;
  // Readable: a connection waits in the backlog.
  for (size_t i = 0; i < polled.size(); ++i) waited_[i] = polled[i].revents != 0;
}

bool ConnectionGate::AcceptFrom(size_t index) {
  const int listener = listeners_[index];
  for (int i = 0; i < kBatch; ++i) {
    {
      absl::MutexLock lock(&mu_);
      if (OverTotal()) return true;  // AcceptLoop sweeps, or waits
    }
    sockaddr_storage peer{};
    socklen_t peer_length = sizeof(peer);
    const int fd = accept4(listener, reinterpret_cast<sockaddr*>(&peer), &peer_length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int error = errno;
      if (error == EAGAIN || error == EWOULDBLOCK) {
        // Those that waited at the cap have all been accepted.
        waited_[index] = false;
        return true;
      }
      if (IsTransient(error)) continue;
      // Out of descriptors or memory (or a listener gone wrong): the
      // connection stays in the backlog; AcceptLoop pauses, then tries again.
      int64_t shortages;
      {
        absl::MutexLock lock(&mu_);
        if (IsShortage(error)) ++descriptor_shortages_;
        shortages = descriptor_shortages_;
      }
      const absl::Time now = absl::Now();
      if (now - last_logged_ >= kLogEvery) {
        last_logged_ = now;
        gpr_log(GPR_ERROR,
                "connection gate: cannot accept a connection (%s); it waits in the backlog, and "
                "the gate tries again every %d ms (%lld shortages of descriptors or memory so "
                "far; logged at most every %lld s)",
                strerror(error), kRetryMs, static_cast<long long>(shortages),
                static_cast<long long>(absl::ToInt64Seconds(kLogEvery)));
      }
      return false;
    }
    struct stat status;
    // Connections at a socket path come from this host, from users its
    // mode admits: one source.
    std::string source = peer.ss_family == AF_UNIX ? "local" : ConnectionSource(peer);
    if (source.empty() || fstat(fd, &status) != 0) {
      // No peer address, or no socket to follow: the caps cannot apply.
      Reset(fd);
      continue;
    }
    bool admitted = false;
    {
      absl::MutexLock lock(&mu_);
      // accept() gave out this number, so the connection it named is closed.
      Forget(fd);
      if (OverSource(source)) SweepSource(source);
      if (OverSource(source)) {
        ++refused_over_source_;
      } else {
        if (waited_[index]) ++refused_over_total_;
        open_per_source_[source].insert(fd);
        connections_.emplace(fd, Connection{status.st_dev, status.st_ino, std::move(source)});
        admitted = true;
        if (OverTotal()) reached_cap_ = true;
      }
    }
    if (!admitted) {
      Reset(fd);
      continue;
    }
    // Accepted sockets inherit TCP_NODELAY from the listener on Linux (as
    // from gRPC's own listeners); set it anyway: gRPC does not.
    if (peer.ss_family != AF_UNIX) SetInt(fd, IPPROTO_TCP, TCP_NODELAY, 1);
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters parameters;
    parameters.listener_fd = listener;
    parameters.fd = fd;
    // The descriptor is gRPC's from here: it closes it with the connection.
    acceptor_->HandleNewConnection(&parameters);
  }
  return true;
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

int64_t ConnectionGate::descriptor_shortages() const {
  absl::MutexLock lock(&mu_);
  return descriptor_shortages_;
}

bool ConnectionGate::OverTotal() const {
  return static_cast<int64_t>(connections_.size()) >= options_.max_connections;
}

bool ConnectionGate::OverSource(const std::string& source) const {
  const auto it = open_per_source_.find(source);
  return it != open_per_source_.end() &&
         static_cast<int64_t>(it->second.size()) >= options_.max_connections_per_source;
}

namespace {

template <typename Connection>
bool StillOpen(int fd, const Connection& connection) {
  struct stat status;
  return fstat(fd, &status) == 0 && status.st_dev == connection.device &&
         status.st_ino == connection.inode;
}

}  // namespace

void ConnectionGate::ShutDownConnections() {
  absl::MutexLock lock(&mu_);
  for (const auto& [fd, connection] : connections_) {
    if (StillOpen(fd, connection)) shutdown(fd, SHUT_RDWR);
  }
}

void ConnectionGate::Sweep() {
  std::vector<int> closed;
  for (const auto& [fd, connection] : connections_) {
    if (!StillOpen(fd, connection)) closed.push_back(fd);
  }
  for (int fd : closed) Forget(fd);
}

void ConnectionGate::SweepSource(const std::string& source) {
  const auto it = open_per_source_.find(source);
  if (it == open_per_source_.end()) return;
  std::vector<int> closed;
  for (int fd : it->second) {
    if (!StillOpen(fd, connections_.at(fd))) closed.push_back(fd);
  }
  for (int fd : closed) Forget(fd);
}

void ConnectionGate::Forget(int fd) {
  const auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  const auto source = open_per_source_.find(it->second.source);
  source->second.erase(fd);
  if (source->second.empty()) open_per_source_.erase(source);
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
