#include "rpc/grpc_credentials.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace pst {
namespace {

constexpr char kBearer[] = "Bearer ";

// The auth context property that names the task a call's token is for.
constexpr char kTaskProperty[] = "pstrain_task";

// Runs before every call on the server: lets it through only with the
// cluster token, or a task token made from it (recording the task).
class TokenChecker final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenChecker(const std::string& token)
      : cluster_token_(token), expected_(absl::StrCat(kBearer, token)) {}

  // The check is a short comparison; no need for gRPC's extra thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed, OutputMetadata*) override {
    auto found = metadata.find(kTokenMetadataKey);
    if (found == metadata.end()) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "this PS requires the cluster token (cluster.auth) and the call carried none");
    }
    absl::string_view given(found->second.data(), found->second.size());
    if (!ConstantTimeEquals(given, expected_)) {
      std::optional<std::string> task;
      if (absl::ConsumePrefix(&given, kBearer)) task = TaskOfToken(given, cluster_token_);
      if (!task) {
        return grpc::Status(
            grpc::StatusCode::UNAUTHENTICATED,
            "the call's token does not match this PS's cluster token (cluster.auth), nor is it "
            "a task token made from it");
      }
      context->AddProperty(kTaskProperty, *task);
    }
    consumed->emplace(kTokenMetadataKey, std::string(found->second.data(), found->second.size()));
    return grpc::Status::OK;
  }

 private:
  const std::string cluster_token_;
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

std::string TokenTaskOf(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  std::vector<grpc::string_ref> tasks = auth->FindPropertyValues(kTaskProperty);
  return tasks.empty() ? "" : std::string(tasks.front().data(), tasks.front().size());
}

absl::Status CheckActsAs(const grpc::ServerContext& context, int worker) {
  const std::string task = TokenTaskOf(context);
  if (task.empty() || task == absl::StrCat("worker:", worker)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the call's token is ", task, "'s task token; it cannot act as worker:", worker));
}

absl::Status CheckClusterToken(const grpc::ServerContext& context, absl::string_view what) {
  const std::string task = TokenTaskOf(context);
  if (task.empty()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the call's token is ", task, "'s task token; only the cluster token may ", what));
}

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
