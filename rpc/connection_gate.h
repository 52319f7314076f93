// A cap on the TCP connections a gRPC server holds open, applied before gRPC
// sees a connection: before TLS, before HTTP/2, before any token is checked.
// It bounds the connections in total and from any one source address, so
// that idle connections (which cost a descriptor each) cannot use up the
// descriptors the process needs for its own files.
//
// The gate listens and accepts itself, one connection at a time, and hands
// gRPC (through its external connection acceptor) only those within its
// caps; so a burst of connections never holds more than one descriptor past
// the caps, however fast it comes:
// - While max_connections admitted connections are open, the gate accepts
//   nothing: new connections wait in the listener's backlog (whose length the
//   kernel bounds, refusing or dropping attempts past it, which clients
//   retry) until an admitted one closes.
// - A connection over its source's cap is reset at once, and counted.
// - If accepting fails for want of a descriptor or of kernel memory, the
//   connection stays in the backlog, and the gate tries again 50 ms later.
//
// The gate also bounds how long an admitted connection may take to complete
// its TLS handshake (if any) and send HTTP/2 SETTINGS (gRPC's handshake
// timeout, 120 s by default); gRPC closes such a connection itself and tells
// no one, so those closes are not counted here.
//
// Use, in this order:
//   auto gate = ConnectionGate::Create(options);               // once
//   absl::StatusOr<int> port = (*gate)->Listen(address, credentials, &builder);
//   std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
//   (*gate)->Serve();    // only once the server has started
//   ...
//   (*gate)->Stop();     // before the server shuts down
//   server->Shutdown();
// gRPC drops (and never closes) a connection handed to a server that has not
// started or has begun to shut down, so Serve() must follow the start and
// Stop() precede the shutdown; a connection that arrives between a shutdown
// and a late Stop() is left open, unserved, until the process exits.
#ifndef PST_RPC_CONNECTION_GATE_H_
#define PST_RPC_CONNECTION_GATE_H_

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "rpc/listening_sockets.h"

namespace pst {

class ConnectionGate {
 public:
  struct Options {
    // Connections open at once, from all sources together.
    int max_connections = 1024;
    // Connections open at once from one source: an IPv4 address, or an
    // IPv6 /64 (rpc/connection_source.h).
    int max_connections_per_source = 128;
    // How long an accepted connection may take to complete its TLS handshake
    // (if any) and send its HTTP/2 SETTINGS before gRPC closes it.
    absl::Duration handshake_timeout = absl::Seconds(10);
  };

  // InvalidArgument unless both caps and the timeout are positive.
  static absl::StatusOr<std::shared_ptr<ConnectionGate>> Create(const Options& options);

  // Stop().
  ~ConnectionGate();

  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Listens on `address` ("host:port", "[v6]:port", a name, port 0 picking
  // one; or "unix:PATH", a socket file of mode 0600 that Stop() removes,
  // its connections one source), as rpc/listening_sockets.h says. Then
  // makes the server `builder` builds take this gate's connections, with
  // `credentials`, and sets its handshake timeout. Returns the port (0 for
  // a socket path).
  // Connections wait in the backlog until Serve().
  // Unavailable ("cannot listen on <address>: <why>; is the port in use or
  // the address not on this host?") if no address could be bound, or any
  // was in use (a socket path: another server accepts on it, or a file of
  // another kind is there); FailedPrecondition if called twice or after
  // Stop().
  absl::StatusOr<int> Listen(const std::string& address,
                             std::shared_ptr<grpc::ServerCredentials> credentials,
                             grpc::ServerBuilder* builder);

  // Starts accepting, on a thread of the gate's. Call it once the server
  // built by Listen's builder has started (BuildAndStart returned it, or
  // QueueServer::Start did). Does nothing before Listen, after Stop, or a
  // second time.
  void Serve();

  // Stops accepting and closes the listening sockets (connections still in
  // their backlog are reset). The connections the gate handed over stay the
  // server's. Call it before the server shuts down; later calls do nothing.
  void Stop();

  // Shuts down (SHUT_RDWR) every admitted connection still open, so that
  // gRPC sees each one end; the descriptors stay gRPC's to close. For a
  // server past its shutdown deadline: in gRPC 1.51 a queue thread reading
  // a connection whose client keeps it full (streams opened and reset in a
  // loop) comes back, and lets the server finish, only when that ends.
  void ShutDownConnections();

  // Admitted connections whose descriptor is still open. Costs one fstat
  // per connection.
  int open_connections();
  // Connections that found max_connections open, waited in the backlog for
  // a place, and were admitted. Approximate: the gate looks whether a place
  // has come free every 50 ms, and counts all that wait when it finds one,
  // and any that arrive before it has accepted them all. Attempts the
  // kernel refused or dropped while the backlog was full are not seen; a
  // waiting connection then reset for its source counts in
  // refused_over_source instead.
  int64_t refused_over_total() const;
  // Connections reset because max_connections_per_source were open from
  // their source.
  int64_t refused_over_source() const;
  // Times accepting failed for want of a descriptor (EMFILE, ENFILE) or of
  // kernel memory; the gate paused 50 ms after each. Zero while the caps
  // leave enough descriptors (MaxConnectionsAfterRaisingFileLimit).
  int64_t descriptor_shortages() const;

 private:
  struct Connection {
    dev_t device;
    ino_t inode;
    std::string source;
  };

  explicit ConnectionGate(const Options& options) : options_(options) {}

  // The accept thread's body: until Stop().
  void AcceptLoop();
  // Accepts from listening_->fds()[index] until it has no more, the total cap is
  // reached, or a batch is done. False after a shortage: then the gate
  // pauses.
  bool AcceptFrom(size_t index);
  // As the total cap is left: notes the listeners where connections wait.
  void NoteWaiting();

  bool OverTotal() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OverSource(const std::string& source) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the connections whose descriptor gRPC has closed: all, or those
  // of one source.
  void Sweep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SweepSource(const std::string& source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;

  // Listen, Serve and Stop, one at a time.
  absl::Mutex lifecycle_mu_;
  bool stopped_ ABSL_GUARDED_BY(lifecycle_mu_) = false;
  // Set by Listen; read by the accept thread while it runs, and closed by
  // Stop once it has ended.
  std::unique_ptr<ListeningSockets> listening_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  int wake_fd_ = -1;  // an eventfd: Stop() writes it to end the thread
  std::thread thread_;
  // The accept thread's alone: when it last logged that it could not
  // accept, and for each listener whether connections waited in its backlog
  // at the total cap that it has not accepted since.
  absl::Time last_logged_ = absl::InfinitePast();
  std::vector<bool> waited_;
  // An admission filled the last place since the loop last looked.
  bool reached_cap_ = false;

  mutable absl::Mutex mu_;
  // gRPC says nothing when it closes a connection: an entry stands until its
  // descriptor no longer names the same socket, which the sweeps check.
  absl::flat_hash_map<int, Connection> connections_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<int>> open_per_source_ ABSL_GUARDED_BY(mu_);
  int64_t refused_over_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_over_source_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t descriptor_shortages_ ABSL_GUARDED_BY(mu_) = 0;
};

// Descriptors MaxConnectionsAfterRaisingFileLimit leaves to the process's own
// files: checkpoints being written, logs, the metrics endpoint's connections,
// gRPC's own epoll and wake-up descriptors, the gate's listening sockets, its
// eventfd and the one connection it may hold while it refuses it.
inline constexpr int kDescriptorReserve = 64;
// The least it returns, whatever the limit.
inline constexpr int kMinMaxConnections = 16;

// Raises this process's soft RLIMIT_NOFILE to its hard limit, then returns
// how many connections fit beside the descriptors open now and `reserve`
// more: soft limit - reserve - open descriptors, at least kMinMaxConnections.
// Call it once, early, before the process opens many files. (Descriptors
// past 1023 cannot be watched with select(2); gRPC and the gate use epoll
// and poll.)
int MaxConnectionsAfterRaisingFileLimit(int reserve = kDescriptorReserve);

}  // namespace pst

#endif  // PST_RPC_CONNECTION_GATE_H_
