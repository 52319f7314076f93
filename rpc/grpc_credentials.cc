#include "rpc/grpc_credentials.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace pst {
namespace {

constexpr char kBearer[] = "Bearer ";

// Runs before every call on the server: lets it through only with the token.
class TokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenChecker(const std::string& token) : expected_(absl::StrCat(kBearer, token)) {}

  // The check is a short comparison; no need for gRPC's extra thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata* consumed,
                       OutputMetadata*) override {
    auto found = metadata.find(kTokenMetadataKey);
    if (found == metadata.end()) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "this PS requires the cluster token (cluster.auth) and the call carried none");
    }
    absl::string_view given(found->second.data(), found->second.size());
    if (!ConstantTimeEquals(given, expected_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "the call's token does not match this PS's cluster token (cluster.auth)");
    }
    consumed->emplace(kTokenMetadataKey, std::string(given));
    return grpc::Status::OK;
  }

 private:
  const std::string expected_;
};

// Adds the token to every call of a channel.
class TokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(const std::string& token) : value_(absl::StrCat(kBearer, token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<std::string, std::string>* metadata) override {
    metadata->emplace(kTokenMetadataKey, value_);
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

}  // namespace

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const ClusterSecurity& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      security.require_client_cert() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                     : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = security.ca_pem();
  options.pem_key_cert_pairs.push_back({security.key_pem(), security.cert_pem()});
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  // Only TLS credentials take a processor (gRPC aborts on plaintext ones);
  // FromConfig never yields a token without TLS.
  if (security.has_token()) {
    credentials->SetAuthMetadataProcessor(std::make_shared<TokenChecker>(security.token()));
  }
  return credentials;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const ClusterSecurity& security) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.ca_pem();
  options.pem_private_key = security.key_pem();
  options.pem_cert_chain = security.cert_pem();
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(options);
  if (!security.has_token()) return credentials;
  return grpc::CompositeChannelCredentials(
      credentials,
      grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenPlugin>(security.token())));
}

void ConfigureChannel(const ClusterSecurity& security, grpc::ChannelArguments* args) {
  if (security.tls() && !security.server_name().empty()) {
    args->SetSslTargetNameOverride(security.server_name());
  }
}

}  // namespace pst
