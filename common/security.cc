#include "common/security.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pst {
namespace {

absl::StatusOr<std::string> ReadPem(absl::string_view field, const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field ", field, " is empty; name a PEM file"));
  }
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  if (!file || contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read ", field, " file ", path, "; check the path and its permissions"));
  }
  return contents.str();
}

absl::StatusOr<std::string> ReadToken(const AuthConfig& auth, std::vector<std::string>* warnings) {
  std::string token;
  std::string source;
  if (!auth.token_file().empty()) {
    source = absl::StrCat("cluster.auth.token_file ", auth.token_file());
    struct stat info;
    if (stat(auth.token_file().c_str(), &info) == 0 && (info.st_mode & S_IROTH) != 0) {
      warnings->push_back(absl::StrCat(
          "the cluster token file ", auth.token_file(),
          " is readable by every user of this machine, who could then call the PS as a "
          "worker; make it private: chmod 600 ", auth.token_file()));
    }
    std::ifstream file(auth.token_file());
    std::stringstream contents;
    contents << file.rdbuf();
    if (!file) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", source, "; check the path and its permissions"));
    }
    token = contents.str();
  } else {
    source = absl::StrCat("environment variable ", auth.token_env(), " (cluster.auth.token_env)");
    const char* value = std::getenv(auth.token_env().c_str());
    token = value == nullptr ? "" : value;
  }
  token = std::string(absl::StripAsciiWhitespace(token));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the token in ", source, " is empty"));
  }
  if (token.size() < kShortTokenLength) {
    warnings->push_back(absl::StrCat(
        "the cluster token in ", source, " is only ", token.size(),
        " characters long, short enough to guess; use at least 32 random characters, e.g. "
        "from: openssl rand -hex 32"));
  }
  return token;
}

}  // namespace

absl::StatusOr<ClusterSecurity> ClusterSecurity::FromConfig(const ClusterConfig& cluster,
                                                            Role role) {
  ClusterSecurity security;
  if (!cluster.has_tls()) return security;
  const TlsConfig& tls = cluster.tls();
  security.tls_ = true;
  security.require_client_cert_ = tls.require_client_cert();
  security.server_name_ = tls.server_name();
  bool needs_own_cert = role == Role::kServer || tls.require_client_cert();
  bool needs_ca = role == Role::kClient || tls.require_client_cert();
  if (needs_own_cert) {
    absl::StatusOr<std::string> cert = ReadPem("cluster.tls.cert", tls.cert());
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("cluster.tls.key", tls.key());
    if (!key.ok()) return key.status();
    security.cert_pem_ = *std::move(cert);
    security.key_pem_ = *std::move(key);
  }
  if (needs_ca) {
    absl::StatusOr<std::string> ca = ReadPem("cluster.tls.ca", tls.ca());
    if (!ca.ok()) return ca.status();
    security.ca_pem_ = *std::move(ca);
  }
  if (cluster.has_auth()) {
    const char* task_token = role == Role::kClient ? std::getenv(kTaskTokenEnv) : nullptr;
    if (task_token != nullptr && *task_token != '\0') {
      security.token_ = std::string(absl::StripAsciiWhitespace(task_token));
      return security;
    }
    absl::StatusOr<std::string> token = ReadToken(cluster.auth(), &security.warnings_);
    if (!token.ok()) return token.status();
    security.token_ = *std::move(token);
  }
  return security;
}

namespace {

constexpr absl::string_view kTaskTokenPrefix = "task:";

std::string TaskTokenMac(absl::string_view cluster_token, absl::string_view task) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const std::string message = absl::StrCat("pstrain task token for ", task);
  HMAC(EVP_sha256(), cluster_token.data(), static_cast<int>(cluster_token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), static_cast<size_t>(length)));
}

}  // namespace

absl::StatusOr<std::string> ReadClusterToken(const ClusterConfig& cluster) {
  std::vector<std::string> warnings;  // FromConfig's caller logs them
  return ReadToken(cluster.auth(), &warnings);
}

std::string TaskToken(absl::string_view cluster_token, absl::string_view task) {
  return absl::StrCat(kTaskTokenPrefix, task, ":", TaskTokenMac(cluster_token, task));
}

std::optional<std::string> TaskOfToken(absl::string_view token, absl::string_view cluster_token) {
  if (!absl::ConsumePrefix(&token, kTaskTokenPrefix)) return std::nullopt;
  const size_t colon = token.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return std::nullopt;
  const absl::string_view task = token.substr(0, colon);
  if (!ConstantTimeEquals(token.substr(colon + 1), TaskTokenMac(cluster_token, task))) {
    return std::nullopt;
  }
  return std::string(task);
}

std::string ClusterSecurity::ConnectFailureHint() const {
  if (!tls_) return "";
  return " (TLS is on: check that the PS certificate is signed by cluster.tls.ca and names the "
         "host, or set cluster.tls.server_name)";
}

bool IsLoopbackAddress(absl::string_view address) {
  // A socket path: reachable from this host only, by whom its mode admits.
  if (absl::StartsWith(address, "unix:")) return true;
  absl::string_view host = address;
  if (absl::ConsumePrefix(&host, "[")) {
    host = host.substr(0, host.find(']'));
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host == "::1" || absl::AsciiStrToLower(host) == "localhost") return true;
  std::vector<absl::string_view> octets = absl::StrSplit(host, '.');
  int first = 0;
  if (octets.size() != 4 || !absl::SimpleAtoi(octets[0], &first) || first != 127) return false;
  for (absl::string_view octet : octets) {
    int value = 0;
    if (!absl::SimpleAtoi(octet, &value) || value < 0 || value > 255) return false;
  }
  return true;
}

absl::Status CheckListenAddress(absl::string_view address, const ClusterSecurity& security,
                                bool allow_insecure) {
  if (security.tls() || allow_insecure || IsLoopbackAddress(address)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve plaintext on ", address,
      ", which other machines can reach; configure cluster.tls or pass --allow_insecure on a "
      "trusted network"));
}

std::optional<std::string> InsecureListenWarning(absl::string_view address,
                                                 const ClusterSecurity& security,
                                                 bool allow_insecure) {
  if (security.tls() || !allow_insecure || IsLoopbackAddress(address)) return std::nullopt;
  return absl::StrCat(
      "serving plaintext on ", address,
      " (--allow_insecure): anyone who can reach this address can read the model and change "
      "it, with no token; use this only on a private network, or configure cluster.tls");
}

std::optional<std::string> ExposedListenWarning(absl::string_view address) {
  if (IsLoopbackAddress(address)) return std::nullopt;
  return absl::StrCat(
      "serving gRPC on ", address,
      " directly: gRPC 1.51 does not bound HTTP/2 floods (streams reset in a loop, header blocks "
      "that never end), which grow this process by gigabytes a second for anyone who reaches it, "
      "token and TLS or not; where untrusted clients can reach it, listen at a socket file "
      "(--listen=unix:PATH) behind the relay of deploy/relay/nghttpx.conf (docs/hardening.md)");
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the longer length in full whatever the contents, folding every
  // difference (including the length) into one value.
  size_t length = std::max(a.size(), b.size());
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < length; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    difference |= x ^ y;
  }
  return difference == 0;
}

}  // namespace pst
