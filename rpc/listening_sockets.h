// The listening sockets a server address names, made by the server itself
// (rpc/connection_gate.h hands what they accept to gRPC):
// - "host:port", "[v6]:port", "localhost:port", a name (port 0 picks one
//   outside the host's ephemeral range, common/server_ports.h, so that a
//   restarted server finds it free):
//   every address the host resolves to, on one port, as gRPC's own
//   AddListeningPort would ("0.0.0.0" and "[::]" both listen on IPv4 and
//   IPv6 where the host has IPv6); with SO_REUSEADDR but not SO_REUSEPORT,
//   so that a port another socket listens on cannot be taken.
// - "unix:PATH": a Unix-domain socket file of mode 0600 (this user only),
//   set before listen(); a socket file nobody accepts on (a server that is
//   gone) is replaced, one another server accepts on, or a file of another
//   kind, is refused. The file is removed with the sockets, if it is still
//   the one made here.
// Nonblocking and close-on-exec; closed when the object goes.
#ifndef PST_RPC_LISTENING_SOCKETS_H_
#define PST_RPC_LISTENING_SOCKETS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pst {

class ListeningSockets {
 public:
  // Unavailable with why not (the address itself left to the caller) if
  // no address could be bound, or any was in use.
  static absl::StatusOr<ListeningSockets> Open(const std::string& address);

  ListeningSockets(ListeningSockets&& other) noexcept;
  ListeningSockets& operator=(ListeningSockets&&) = delete;
  ListeningSockets(const ListeningSockets&) = delete;
  ~ListeningSockets();

  const std::vector<int>& fds() const { return fds_; }
  // The TCP port every socket listens on; 0 for a socket file.
  int port() const { return port_; }

 private:
  ListeningSockets() = default;

  std::vector<int> fds_;
  int port_ = 0;
  // The socket file made for "unix:PATH", and its identity: a later
  // server's socket at the same path is another inode, and stays.
  std::string socket_path_;
  dev_t device_ = 0;
  ino_t inode_ = 0;
};

}  // namespace pst

#endif  // PST_RPC_LISTENING_SOCKETS_H_
