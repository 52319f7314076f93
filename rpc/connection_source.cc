#include "rpc/connection_source.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pst {

std::string ConnectionSource(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "";
  if (peer.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&peer)->sin_addr, text, sizeof(text));
    return text;
  }
  if (peer.ss_family != AF_INET6) return "";
  const in6_addr& address = reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&address)) {
    inet_ntop(AF_INET, &address.s6_addr[12], text, sizeof(text));
    return text;
  }
  if (IN6_IS_ADDR_LOOPBACK(&address)) return "::1";
  in6_addr prefix{};
  std::memcpy(prefix.s6_addr, address.s6_addr, 8);
  inet_ntop(AF_INET6, &prefix, text, sizeof(text));
  return absl::StrCat(text, "/64");
}

}  // namespace pst
