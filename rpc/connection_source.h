// What counts as one source for the per-source connection cap
// (rpc/connection_gate.h): one party, as far as its address tells.
//  - An IPv4 address is a source of its own (an IPv4-mapped IPv6 address
//    counts as its IPv4 address).
//  - An IPv6 address counts as its /64 prefix: a host is given a whole /64
//    and may connect from any address in it (privacy addresses), so a cap
//    per address would be no cap.
//  - Loopback addresses (127.0.0.0/8, ::1) are each a source of their own,
//    though any local process may use any of them: on one host the workers
//    share loopback with every other process, and one source for all of it
//    would let any local process lock them out with a few idle
//    connections. Against local processes stand the total cap, the
//    handshake and idle timeouts and the tokens, not this cap.
#ifndef PST_RPC_CONNECTION_SOURCE_H_
#define PST_RPC_CONNECTION_SOURCE_H_

#include <sys/socket.h>

#include <string>

namespace pst {

// The source of a connection from `peer`: "192.0.2.7", "127.0.0.2" or
// "2001:db8:1:2::/64"; "" for an address of another family.
std::string ConnectionSource(const sockaddr_storage& peer);

}  // namespace pst

#endif  // PST_RPC_CONNECTION_SOURCE_H_
