#include "pslaunch/ports.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pst {
namespace {

// Why binding `address` fails, when another socket holds it or this user
// may not bind it; nullopt when it binds, or fails for any other reason.
std::optional<std::string> BindRefusal(const sockaddr* address, socklen_t length) {
  const int fd = socket(address->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (address->sa_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
  std::optional<std::string> refusal;
  if (bind(fd, address, length) != 0 && (errno == EADDRINUSE || errno == EACCES)) {
    refusal = errno == EADDRINUSE ? "the port is in use" : "this user may not bind that port";
  }
  close(fd);
  return refusal;
}

// Why `host`:`port` cannot be bound here, trying every address it resolves
// to as ps_server's listener does.
std::optional<std::string> HostPortRefusal(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(), service.c_str(), &hints,
                  &found) != 0) {
    return std::nullopt;
  }
  std::optional<std::string> refusal;
  for (const addrinfo* a = found; a != nullptr && !refusal; a = a->ai_next) {
    refusal = BindRefusal(a->ai_addr, a->ai_addrlen);
  }
  freeaddrinfo(found);
  return refusal;
}

std::string TaskName(const JobConfig& config, int index) {
  const int shards = config.cluster().ps_size();
  return index < shards ? absl::StrCat("ps:", index) : absl::StrCat("worker:", index - shards);
}

}  // namespace

std::optional<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return std::nullopt;
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

absl::Status CheckTaskPorts(const JobConfig& config, const MetricsPorts& metrics) {
  std::map<int, int> ps_ports;  // port -> the first shard whose address names it
  for (int i = 0; i < config.cluster().ps_size(); ++i) {
    const std::string& address = config.cluster().ps(i);
    std::optional<std::pair<std::string, int>> split = SplitHostPort(address);
    if (!split || split->second == 0) continue;
    ps_ports.emplace(split->second, i);
    if (std::optional<std::string> refusal = HostPortRefusal(split->first, split->second)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster.ps[", i, "] ", address, ": ", *refusal,
          " on this host; stop what listens there (a ps_server of an earlier run?) or pick "
          "another port"));
    }
  }
  if (metrics.first_port == 0) return absl::OkStatus();
  const int tasks = config.cluster().ps_size() + config.cluster().workers();
  const int last = metrics.first_port + tasks - 1;
  if (last > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_port=", metrics.first_port, " gives the ", tasks, " tasks the ports ",
        metrics.first_port, "..", last, ", past 65535; pick a port of at most ", 65536 - tasks));
  }
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, metrics.address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, metrics.address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    length = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_address=", metrics.address,
        " is not an IP address; use e.g. 127.0.0.1 or 0.0.0.0"));
  }
  for (int i = 0; i < tasks; ++i) {
    const int port = metrics.first_port + i;
    if (auto shard = ps_ports.find(port); shard != ps_ports.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_port=", metrics.first_port, " gives ", TaskName(config, i), " port ", port,
          ", which cluster.ps[", shard->second, "] listens on; pick another --metrics_port"));
    }
    v4->sin_port = htons(static_cast<uint16_t>(port));  // the same field in sockaddr_in6
    static_assert(offsetof(sockaddr_in, sin_port) == offsetof(sockaddr_in6, sin6_port));
    if (std::optional<std::string> refusal =
            BindRefusal(reinterpret_cast<const sockaddr*>(&storage), length)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_port=", metrics.first_port, " gives ", TaskName(config, i), " port ", port,
          " on ", metrics.address, ": ", *refusal, "; pick another --metrics_port"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pst
