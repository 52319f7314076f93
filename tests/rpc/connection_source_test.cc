// What one source is for the per-source connection cap.
#include "rpc/connection_source.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <string>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

sockaddr_storage Peer(const std::string& address) {
  sockaddr_storage peer{};
  if (address.find(':') == std::string::npos) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&peer);
    v4->sin_family = AF_INET;
    EXPECT_EQ(inet_pton(AF_INET, address.c_str(), &v4->sin_addr), 1) << address;
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&peer);
    v6->sin6_family = AF_INET6;
    EXPECT_EQ(inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr), 1) << address;
  }
  return peer;
}

TEST(ConnectionSourceTest, AnIpv4AddressOrAnIpv6SlashSixtyFourIsOneSource) {
  struct Case {
    std::string peer;
    std::string source;
  };
  const Case cases[] = {
      {"192.0.2.7", "192.0.2.7"},
      {"::ffff:192.0.2.7", "192.0.2.7"},  // IPv4-mapped: the same source
      {"127.0.0.1", "127.0.0.1"},
      {"127.0.0.2", "127.0.0.2"},  // each loopback address its own
      {"::1", "::1"},
      {"2001:db8:1:2::1", "2001:db8:1:2::/64"},
      {"2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::/64"},  // same /64
      {"2001:db8:1:3::1", "2001:db8:1:3::/64"},
      {"fe80::1:2:3:4", "fe80::/64"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.peer);
    EXPECT_EQ(ConnectionSource(Peer(c.peer)), c.source);
  }
  sockaddr_storage unix_peer{};
  unix_peer.ss_family = AF_UNIX;
  EXPECT_EQ(ConnectionSource(unix_peer), "");
}

}  // namespace PST_FILE_ID
}  // namespace pst
