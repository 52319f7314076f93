#include "rpc/listening_sockets.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/server_ports.h"
#include "common/status_macros.h"

namespace pst {
namespace {

// Connections waiting to be accepted that each listening socket holds
// (the kernel caps it at net.core.somaxconn).
constexpr int kBacklog = 1024;

// Ports tried for an address with port 0 before the kernel picks one.
constexpr size_t kPortZeroTries = 64;

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

// FailedPrecondition unless another user cannot take the socket at `path`
// over: its folder must be this user's or root's (its owner may rename
// anything in it, sticky or not), and writable by no other user, unless it
// is sticky (as /tmp), where others cannot rename or remove what is this
// user's. In a folder others may write to, one of them could rename the
// PS's socket away, listen at its path, and read the next client's bearer
// token.
absl::Status CheckSocketFolder(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat status;
  if (stat(folder.c_str(), &status) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot inspect the socket's folder ", folder, ": ", std::strerror(errno)));
  }
  const auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the socket's folder ", folder, " ", why,
        ", so another user could put their own socket at ", path,
        " and read what clients send; choose a folder only this user can write to "
        "(pslaunch --relay puts the socket in its run directory, mode 0700)"));
  };
  if (!S_ISDIR(status.st_mode)) return refuse("is not a directory");
  if (status.st_uid != geteuid() && status.st_uid != 0) {
    return refuse(absl::StrCat("belongs to uid ", status.st_uid, ", not to this user (uid ",
                               geteuid(), ")"));
  }
  if ((status.st_mode & S_ISVTX) != 0) return absl::OkStatus();
  if ((status.st_mode & S_IWOTH) != 0) return refuse("can be written by any user");
  if ((status.st_mode & S_IWGRP) != 0 && status.st_gid != getegid()) {
    return refuse(absl::StrCat("can be written by group ", status.st_gid));
  }
  return absl::OkStatus();
}

// A socket listening at the filesystem path `path` (an AF_UNIX stream
// socket), reachable only by those whom the file's mode (0600: this user)
// and its folders admit; or why not. A socket file left by a server that
// is gone (nothing accepts on it) is replaced; one that still serves, or a
// file of another kind, is left alone. A folder another user could write
// to is refused (CheckSocketFolder).
absl::StatusOr<int> ListenOnPath(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::UnavailableError(
        absl::StrCat("a socket path must have 1 to ", sizeof(address.sun_path) - 1, " bytes"));
  }
  PST_RETURN_IF_ERROR(CheckSocketFolder(path));
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
    // In a sticky folder the path may have been another user's: the file
    // bound must be this user's own.
    struct stat made;
    if (lstat(path.c_str(), &made) != 0 || !S_ISSOCK(made.st_mode) || made.st_uid != geteuid()) {
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("the socket at ", path, " is not this user's after binding it"));
    }
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

int PortOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
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

// The sockets listening on every endpoint at one port, or why not.
struct Bound {
  Bound() = default;
  Bound(Bound&& other) noexcept { *this = std::move(other); }
  Bound& operator=(Bound&& other) noexcept {
    Close();
    fds = std::exchange(other.fds, {});
    port = other.port;
    errors = std::move(other.errors);
    in_use = other.in_use;
    return *this;
  }
  ~Bound() { Close(); }
  void Close() {
    for (int fd : fds) close(fd);
    fds.clear();
  }
  bool ok() const { return !fds.empty() && port != 0 && !in_use; }

  std::vector<int> fds;
  int port = 0;
  std::vector<std::string> errors;
  bool in_use = false;  // another socket has the port on one of them
};

// Listens on every endpoint at `port`; with 0, at the endpoints' own port,
// or where that is 0 too, at the one the kernel gives the first (as gRPC
// does for port 0). Like gRPC, some of a name's addresses suffice (where
// the host has no IPv6, say); unlike it, not if another server has the
// port on another: the two would split the connections between them. What
// was bound is closed again when it does not suffice.
Bound BindEndpoints(std::vector<Endpoint> endpoints, int port) {
  Bound bound;
  const bool wildcard = endpoints.front().dual_stack;
  for (Endpoint& endpoint : endpoints) {
    if (port != 0) SetPort(&endpoint.address, port);
    if (bound.port != 0) SetPort(&endpoint.address, bound.port);
    const Listening listening = ListenOn(reinterpret_cast<const sockaddr*>(&endpoint.address),
                                         endpoint.length, endpoint.dual_stack);
    if (listening.fd >= 0) {
      bound.fds.push_back(listening.fd);
      if (bound.port == 0) bound.port = PortOf(listening.fd);
      // A dual-stack [::] takes IPv4 too: 0.0.0.0 is its fallback only.
      if (wildcard) break;
      continue;
    }
    bound.errors.push_back(ErrnoText(listening.call, listening.error));
    // The wildcard falls back to IPv4 for want of IPv6, not for a port in use.
    if (listening.error == EADDRINUSE) {
      bound.in_use = true;
      break;
    }
  }
  if (!bound.ok()) bound.Close();
  return bound;
}

}  // namespace

absl::StatusOr<ListeningSockets> ListeningSockets::Open(const std::string& address) {
  if (absl::StartsWith(address, "unix:")) {
    ListeningSockets sockets;
    const std::string path = address.substr(5);
    absl::StatusOr<int> listener = ListenOnPath(path);
    if (!listener.ok()) return listener.status();
    sockets.fds_.push_back(*listener);
    struct stat made;
    if (stat(path.c_str(), &made) == 0) {
      sockets.socket_path_ = path;
      sockets.device_ = made.st_dev;
      sockets.inode_ = made.st_ino;
    }
    return sockets;
  }
  absl::StatusOr<std::vector<Endpoint>> endpoints = Resolve(address);
  if (!endpoints.ok()) return endpoints.status();
  Bound bound;
  if (PortOf(endpoints->front().address) != 0) {
    bound = BindEndpoints(*endpoints, 0);
  } else {
    // Port 0: a port outside the ephemeral range (common/server_ports.h),
    // so that a restart finds it free; the kernel's own pick only where
    // the first tries are all taken.
    const std::vector<int> candidates = ServerPortCandidates();
    for (size_t i = 0; i < std::min(candidates.size(), kPortZeroTries) && !bound.ok(); ++i) {
      bound = BindEndpoints(*endpoints, candidates[i]);
      if (!bound.ok() && !bound.in_use) break;
    }
    if (!bound.ok() && bound.in_use) bound = BindEndpoints(*endpoints, 0);
  }
  if (!bound.ok()) return absl::UnavailableError(absl::StrJoin(bound.errors, "; "));
  ListeningSockets sockets;
  sockets.fds_ = std::exchange(bound.fds, {});
  sockets.port_ = bound.port;
  return sockets;
}

ListeningSockets::ListeningSockets(ListeningSockets&& other) noexcept
    : fds_(std::exchange(other.fds_, {})),
      port_(other.port_),
      socket_path_(std::exchange(other.socket_path_, {})),
      device_(other.device_),
      inode_(other.inode_) {}

ListeningSockets::~ListeningSockets() {
  for (int fd : fds_) close(fd);
  struct stat now;
  if (!socket_path_.empty() && stat(socket_path_.c_str(), &now) == 0 && now.st_dev == device_ &&
      now.st_ino == inode_) {
    unlink(socket_path_.c_str());
  }
}

}  // namespace pst
