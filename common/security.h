// Transport security and authentication for every channel of a cluster.
//
// One ClusterSecurity holds what cluster.tls and cluster.auth name, read and
// checked: the PEM files and the token one end of a channel needs. The gRPC
// credentials made from it (rpc/grpc_credentials.h) give a PS TLS, the
// optional client-certificate check and a token check on every call, and
// give clients (workers, psctl) TLS, their certificate and the token as
// call metadata. Without cluster.tls both sides speak plaintext, which
// ps_server accepts only on loopback addresses unless told --allow_insecure.
#ifndef PST_COMMON_SECURITY_H_
#define PST_COMMON_SECURITY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config.pb.h"

namespace pst {

// The call metadata that carries the token: "authorization: Bearer <token>".
inline constexpr char kTokenMetadataKey[] = "authorization";

class ClusterSecurity {
 public:
  // Which end of a channel this process is; each needs different files.
  //   kServer: tls.cert and tls.key (and tls.ca with require_client_cert).
  //   kClient: tls.ca (and tls.cert, tls.key with require_client_cert).
  enum class Role { kServer, kClient };

  // Reads the PEM files and the token the config names. InvalidArgument,
  // naming the field and the file or variable, if one is missing or empty.
  // A client with cluster.auth carries the task token in PSTRAIN_TASK_TOKEN
  // when that is set (and then needs no cluster token).
  static absl::StatusOr<ClusterSecurity> FromConfig(const ClusterConfig& cluster, Role role);

  // No TLS, no token: loopback tests and --allow_insecure clusters.
  static ClusterSecurity Plaintext() { return ClusterSecurity(); }

  bool tls() const { return tls_; }
  bool require_client_cert() const { return require_client_cert_; }
  bool has_token() const { return !token_.empty(); }

  // The PEM contents of this end's certificate and key (empty when its role
  // needs none) and of the CA it trusts; the name expected in the PS
  // certificate (tls.server_name, may be empty); the token.
  const std::string& cert_pem() const { return cert_pem_; }
  const std::string& key_pem() const { return key_pem_; }
  const std::string& ca_pem() const { return ca_pem_; }
  const std::string& server_name() const { return server_name_; }
  const std::string& token() const { return token_; }

  // Appended to a "cannot reach" error: what to check when TLS is on.
  std::string ConnectFailureHint() const;

  // What FromConfig found weak but usable, one line each, for the process
  // to log: a token file other users can read, a token too short to resist
  // guessing. Each names the file or variable and what to do.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  bool tls_ = false;
  bool require_client_cert_ = false;
  std::string cert_pem_;
  std::string key_pem_;
  std::string ca_pem_;
  std::string server_name_;
  std::string token_;
  std::vector<std::string> warnings_;
};

// A task's own token: what a process acting as `task` ("worker:3")
// carries instead of the cluster token, so that with cluster.auth it can
// act as that task and no other. "task:<task>:<HMAC-SHA256 of the task
// keyed by the cluster token, in hex>": the PS, which holds the cluster
// token, checks it; the task's process needs nothing else (pslaunch hands
// each worker its own in PSTRAIN_TASK_TOKEN; `psctl token` prints one).
std::string TaskToken(absl::string_view cluster_token, absl::string_view task);

// The task `token` is `cluster_token`'s task token for; nullopt if it is
// none (checked in constant time).
std::optional<std::string> TaskOfToken(absl::string_view token, absl::string_view cluster_token);

// The cluster token cluster.auth names (file or variable), as a PS reads
// it: for a launcher that makes each task's token. InvalidArgument as
// FromConfig's.
absl::StatusOr<std::string> ReadClusterToken(const ClusterConfig& cluster);

// The environment variable a worker reads its task token from; when set,
// it is the token the worker carries, in place of cluster.auth's.
inline constexpr char kTaskTokenEnv[] = "PSTRAIN_TASK_TOKEN";

// Tokens shorter than this get a warning: a few characters can be guessed.
inline constexpr size_t kShortTokenLength = 16;

// Whether `address` ("host:port", "[v6]:port", "unix:PATH") accepts
// connections from this machine only: 127.0.0.0/8, ::1, "localhost" or a
// Unix-domain socket path. Names are not resolved.
bool IsLoopbackAddress(absl::string_view address);

// FailedPrecondition if a plaintext server would listen on `address` beyond
// loopback and `allow_insecure` is false.
absl::Status CheckListenAddress(absl::string_view address, const ClusterSecurity& security,
                                bool allow_insecure);

// A warning for a server that serves plaintext beyond loopback because
// `allow_insecure` says so: anyone who can reach it can read and change the
// model. nullopt when TLS is on or the address is loopback.
std::optional<std::string> InsecureListenWarning(absl::string_view address,
                                                 const ClusterSecurity& security,
                                                 bool allow_insecure);

// A warning for a server that takes connections beyond loopback itself:
// gRPC 1.51 bounds neither HTTP/2 streams opened and reset in a loop nor
// header blocks that never end, and either, from anyone who can reach the
// address, grows the server by gigabytes in seconds, before any token or
// certificate is checked. The remedy, named in the warning, is the relay of
// deploy/relay/nghttpx.conf in front, with the server at a socket file.
// nullopt for a loopback address or a socket file.
std::optional<std::string> ExposedListenWarning(absl::string_view address);

// Whether a == b, taking time that depends on the lengths only, so a caller
// cannot learn a token byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace pst

#endif  // PST_COMMON_SECURITY_H_
