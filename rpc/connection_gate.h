// A cap on the TCP connections a gRPC server holds open, applied the moment
// a connection is accepted: before TLS, before HTTP/2, before any token is
// checked. It bounds the connections in total and from any one source
// address, so that idle connections (which cost a descriptor each) cannot
// use up the descriptors the process needs for its own files.
//
// A connection over a cap is reset at once, and counted; it holds its
// descriptor only until gRPC's first read of it. The gate also bounds how
// long an admitted connection may take to complete its TLS handshake (if
// any) and send HTTP/2 SETTINGS (gRPC's handshake timeout, 120 s by
// default); gRPC closes such a connection itself and tells no one, so those
// closes are not counted here.
//
// It relies on gRPC's socket mutator, which the posix TCP server (gRPC 1.51,
// iomgr) runs on every connection it accepts, on its poller thread.
// Connections handed to gRPC through an external connection acceptor
// bypass it.
#ifndef PST_RPC_CONNECTION_GATE_H_
#define PST_RPC_CONNECTION_GATE_H_

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_builder.h"

namespace pst {

class ConnectionGate : public std::enable_shared_from_this<ConnectionGate> {
 public:
  struct Options {
    // Connections open at once, from all sources together.
    int max_connections = 1024;
    // Connections open at once from one source address (an IPv4-mapped IPv6
    // address counts as its IPv4 address).
    int max_connections_per_source = 128;
    // How long an accepted connection may take to complete its TLS handshake
    // (if any) and send its HTTP/2 SETTINGS before gRPC closes it.
    absl::Duration handshake_timeout = absl::Seconds(10);
  };

  // InvalidArgument unless both caps and the timeout are positive.
  static absl::StatusOr<std::shared_ptr<ConnectionGate>> Create(const Options& options);

  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Makes every server `builder` builds pass its connections through this
  // gate, and sets its handshake timeout. Replaces any socket mutator set on
  // `builder` before. Each such server holds a reference to the gate for as
  // long as it uses it, so the gate may be dropped before or after them.
  // Servers built with one gate share its caps.
  void InstallOn(grpc::ServerBuilder* builder);

  // Admitted connections whose descriptor is still open. Costs one fstat
  // per connection, as does every connection that finds a cap reached.
  int open_connections();
  // Connections reset because max_connections were open.
  int64_t refused_over_total() const;
  // Connections reset because max_connections_per_source were open from
  // their source (and fewer than max_connections in total).
  int64_t refused_over_source() const;

 private:
  friend class GateSocketMutator;

  struct Connection {
    dev_t device;
    ino_t inode;
    std::string source;
  };

  explicit ConnectionGate(const Options& options) : options_(options) {}

  // For a connection gRPC has just accepted: admits it (true), or resets it
  // (false), which gRPC then sees as the peer's close. Never blocks; the
  // descriptor stays gRPC's either way.
  bool Admit(int fd);

  bool OverTotal() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OverSource(const std::string& source) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the connections whose descriptor gRPC has closed.
  void Sweep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  // gRPC says nothing when it closes a connection: an entry stands until its
  // descriptor no longer names the same socket, which Sweep() checks.
  absl::flat_hash_map<int, Connection> connections_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> open_per_source_ ABSL_GUARDED_BY(mu_);
  int64_t refused_over_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_over_source_ ABSL_GUARDED_BY(mu_) = 0;
};

// Descriptors MaxConnectionsAfterRaisingFileLimit leaves to the process's own
// files: checkpoints being written, logs, the metrics endpoint's connections,
// gRPC's own epoll and wake-up descriptors.
inline constexpr int kDescriptorReserve = 64;
// The least it returns, whatever the limit.
inline constexpr int kMinMaxConnections = 16;

// Raises this process's soft RLIMIT_NOFILE to its hard limit, then returns
// how many connections fit beside the descriptors open now and `reserve`
// more: soft limit - reserve - open descriptors, at least kMinMaxConnections.
// Call it once, early, before the process opens many files. (Descriptors
// past 1023 cannot be watched with select(2); gRPC uses epoll.)
int MaxConnectionsAfterRaisingFileLimit(int reserve = kDescriptorReserve);

}  // namespace pst

#endif  // PST_RPC_CONNECTION_GATE_H_
