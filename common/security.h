// Transport security and authentication for every gRPC channel of a cluster.
//
// One ClusterSecurity, built from cluster.tls and cluster.auth, gives a PS
// its server credentials (TLS, the optional client-certificate check, and a
// token check on every call) and gives clients (workers, psctl) the matching
// channel credentials (TLS, client certificate, the token as call metadata).
// Without cluster.tls both sides speak plaintext, which ps_server accepts
// only on loopback addresses unless told --allow_insecure.
#ifndef PST_COMMON_SECURITY_H_
#define PST_COMMON_SECURITY_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config.pb.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

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
  static absl::StatusOr<ClusterSecurity> FromConfig(const ClusterConfig& cluster, Role role);

  // No TLS, no token: loopback tests and --allow_insecure clusters.
  static ClusterSecurity Plaintext() { return ClusterSecurity(); }

  bool tls() const { return tls_; }
  bool has_token() const { return !token_.empty(); }

  // For grpc::ServerBuilder::AddListeningPort. With a token, every call
  // without it (or with another) fails UNAUTHENTICATED before it reaches
  // the service.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;

  // For grpc::CreateCustomChannel, together with ConfigureChannel.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

  // Sets the name expected in the PS certificate when tls.server_name is given.
  void ConfigureChannel(grpc::ChannelArguments* args) const;

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

// Tokens shorter than this get a warning: a few characters can be guessed.
inline constexpr size_t kShortTokenLength = 16;

// Whether `address` ("host:port", "[v6]:port") accepts connections from
// this machine only: 127.0.0.0/8, ::1 or "localhost". Names are not resolved.
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

// Whether a == b, taking time that depends on the lengths only, so a caller
// cannot learn a token byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace pst

#endif  // PST_COMMON_SECURITY_H_
