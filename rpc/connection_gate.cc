#include "rpc/connection_gate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "rpc/connection_source.h"
#include "rpc/listening_sockets.h"

namespace pst {
namespace {

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
  if (stopped_ || listening_ != nullptr) {
    return absl::FailedPreconditionError("a connection gate listens once, before it is stopped");
  }
  const auto unavailable = [&address](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", why,
                                               "; is the port in use or the address not on this "
                                               "host?"));
  };
  absl::StatusOr<ListeningSockets> listening = ListeningSockets::Open(address);
  if (absl::IsFailedPrecondition(listening.status())) {
    // Not a port taken for now: no restart changes it.
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on ", address, ": ", listening.status().message()));
  }
  if (!listening.ok()) return unavailable(listening.status().message());
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) return unavailable(absl::StrCat("eventfd: ", strerror(errno)));
  listening_ = std::make_unique<ListeningSockets>(*std::move(listening));
  wake_fd_ = wake_fd;
  acceptor_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      std::move(credentials));
  const int64_t timeout_ms = std::clamp<int64_t>(
      absl::ToInt64Milliseconds(options_.handshake_timeout), 1, INT_MAX);
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, static_cast<int>(timeout_ms));
  return listening_->port();
}

void ConnectionGate::Serve() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  if (stopped_ || listening_ == nullptr || thread_.joinable()) return;
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
  listening_.reset();  // closes the listeners (and removes a socket file)
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

void ConnectionGate::AcceptLoop() {
  waited_.assign(listening_->fds().size(), false);
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
      for (int listener : listening_->fds()) polled.push_back({.fd = listener, .events = POLLIN, .revents = 0});
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
  for (int listener : listening_->fds()) polled.push_back({.fd = listener, .events = POLLIN, .revents = 0});
  if (poll(polled.data(), polled.size(), 0) < 0) return;
  // Readable: a connection waits in the backlog.
  for (size_t i = 0; i < polled.size(); ++i) waited_[i] = polled[i].revents != 0;
}

bool ConnectionGate::AcceptFrom(size_t index) {
  const int listener = listening_->fds()[index];
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
    if (peer.ss_family != AF_UNIX) {
      const int on = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    }
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
