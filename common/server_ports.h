// The ports a server picks when its address leaves the port to the system
// ("127.0.0.1:0"): outside the host's local ephemeral range
// (net.ipv4.ip_local_port_range), which the kernel draws the local port of
// every outgoing connection from. A server restarted on the port it had
// must find it free; inside that range, any connection made while it was
// down (a client retrying it, which can even connect to itself) may hold
// the port, and the restart fails with "address in use".
#ifndef PST_COMMON_SERVER_PORTS_H_
#define PST_COMMON_SERVER_PORTS_H_

#include <utility>
#include <vector>

namespace pst {

// The lowest port a server picks: below it lie the well-known and many
// registered services' ports.
inline constexpr int kFirstServerPort = 10000;

// The host's local ephemeral range, both ends included: what
// /proc/sys/net/ipv4/ip_local_port_range holds, or Linux's default
// {32768, 60999} where it cannot be read.
std::pair<int, int> EphemeralPortRange();

// Every port from kFirstServerPort to 65535 outside EphemeralPortRange(),
// in a random order (two servers picking at once rarely try the same
// port first). Empty only if that range covers them all.
std::vector<int> ServerPortCandidates();

}  // namespace pst

#endif  // PST_COMMON_SERVER_PORTS_H_
