// What cluster.tls and cluster.auth name, read and checked: missing files
// and tokens are named, weak tokens warned about; and where a plaintext PS
// may listen. Certificates come from openssl, made per run. The credentials
// made from these, over gRPC, are tests/rpc/grpc_credentials_test.cc's.
#include "common/security.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/secure_cluster_test.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr char kTokenEnv[] = "PST_SECURITY_TEST_TOKEN";

class SecurityTest : public SecureClusterTest {
 protected:
  SecurityTest() : SecureClusterTest(kTokenEnv) {}
};

TEST_F(SecurityTest, MissingFilesAndTokensAreNamed) {
  struct Case {
    std::string name;
    ClusterConfig cluster;
    ClusterSecurity::Role role;
    std::string message;
  };
  ClusterConfig no_key = SecureCluster(false);
  no_key.mutable_tls()->set_key(dir() + "/absent.key");
  ClusterConfig no_ca = SecureCluster(false);
  no_ca.mutable_tls()->set_ca("");
  ClusterConfig unset_env = SecureCluster(false);
  unset_env.mutable_auth()->set_token_env("PST_SECURITY_TEST_UNSET");
  std::vector<Case> cases = {
      {"server key missing", no_key, ClusterSecurity::Role::kServer,
       "cannot read cluster.tls.key file " + dir() + "/absent.key"},
      {"client needs the ca", no_ca, ClusterSecurity::Role::kClient,
       "config field cluster.tls.ca is empty"},
      {"token variable unset", unset_env, ClusterSecurity::Role::kClient,
       "the token in environment variable PST_SECURITY_TEST_UNSET (cluster.auth.token_env) is empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<ClusterSecurity> security = ClusterSecurity::FromConfig(c.cluster, c.role);
    ASSERT_FALSE(security.ok());
    EXPECT_EQ(security.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(security.status().message()), HasSubstr(c.message));
  }
}

TEST(ListenAddressTest, PlaintextOnlyOnLoopbackUnlessAllowed) {
  struct Case {
    std::string address;
    bool loopback;
  };
  std::vector<Case> cases = {
      {"127.0.0.1:50051", true},  {"127.1.2.3:1", true},     {"localhost:50051", true},
      {"[::1]:50051", true},      {"0.0.0.0:50051", false},  {"[::]:50051", false},
      {"10.0.0.1:50051", false},  {"ps:50051", false},       {"127.0.0.1.example:1", false},
      {"ps-0.ps:50051", false},   {"128.0.0.1:1", false},    {"unix:/run/ps0.sock", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.address);
    EXPECT_EQ(IsLoopbackAddress(c.address), c.loopback);
    absl::Status plain = CheckListenAddress(c.address, ClusterSecurity::Plaintext(), false);
    EXPECT_EQ(plain.ok(), c.loopback);
    if (!plain.ok()) {
      EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(plain.message()), HasSubstr("--allow_insecure"));
    }
    EXPECT_TRUE(CheckListenAddress(c.address, ClusterSecurity::Plaintext(), true).ok());
    // Allowed, but said out loud: anyone who can reach it can change the model.
    std::optional<std::string> warning =
        InsecureListenWarning(c.address, ClusterSecurity::Plaintext(), true);
    EXPECT_EQ(warning.has_value(), !c.loopback);
    if (warning) {
      EXPECT_THAT(*warning, HasSubstr(c.address));
      EXPECT_THAT(*warning, HasSubstr("cluster.tls"));
    }
    EXPECT_FALSE(InsecureListenWarning(c.address, ClusterSecurity::Plaintext(), false));
    // Beyond loopback, TLS or not: the floods gRPC does not bound, and the relay.
    std::optional<std::string> exposed = ExposedListenWarning(c.address);
    EXPECT_EQ(exposed.has_value(), !c.loopback);
    if (exposed) {
      EXPECT_THAT(*exposed, HasSubstr(c.address));
      EXPECT_THAT(*exposed, HasSubstr("deploy/relay/nghttpx.conf"));
    }
  }
}

// A token other users can read, or one short enough to guess, is served
// but warned about, naming the file and what to do.
TEST_F(SecurityTest, AWeakTokenIsWarnedAbout) {
  struct Case {
    const char* name;
    const char* token;
    std::filesystem::perms perms;
    std::vector<std::string> warned;  // substrings, one per warning expected
  };
  const std::string strong(40, 'k');
  const std::vector<Case> cases = {
      {"private and long", strong.c_str(), std::filesystem::perms::owner_read, {}},
      {"world-readable", strong.c_str(),
       std::filesystem::perms::owner_read | std::filesystem::perms::group_read |
           std::filesystem::perms::others_read,
       {"chmod 600"}},
      {"three characters", "abc", std::filesystem::perms::owner_read, {"3 characters"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string token_file = absl::StrCat(dir(), "/weak.", &c - cases.data(), ".token");
    std::ofstream(token_file) << c.token << "\n";
    std::filesystem::permissions(token_file, c.perms);
    ClusterConfig cluster = SecureCluster(false);
    cluster.mutable_auth()->set_token_file(token_file);
    absl::StatusOr<ClusterSecurity> security =
        ClusterSecurity::FromConfig(cluster, ClusterSecurity::Role::kServer);
    ASSERT_TRUE(security.ok()) << security.status();
    ASSERT_EQ(security->warnings().size(), c.warned.size());
    for (size_t i = 0; i < c.warned.size(); ++i) {
      EXPECT_THAT(security->warnings()[i], HasSubstr(c.warned[i]));
      EXPECT_THAT(security->warnings()[i], HasSubstr(token_file));
    }
  }
}

TEST(TaskTokenTest, NamesItsTaskUnderItsClusterTokenOnly) {
  const std::string cluster = "cluster-secret-of-32-characters!";
  const std::string token = TaskToken(cluster, "worker:3");
  EXPECT_THAT(token, ::testing::StartsWith("task:worker:3:"));
  EXPECT_EQ(TaskOfToken(token, cluster), "worker:3");
  EXPECT_NE(TaskToken(cluster, "worker:4"), token);
  struct Case {
    const char* what;
    std::string token;
  };
  std::string tampered = token;
  tampered.back() = tampered.back() == '0' ? '1' : '0';
  std::string renamed = token;
  renamed.replace(renamed.find("worker:3"), 8, "worker:4");
  const Case refused[] = {
      {"another cluster's", TaskToken("another cluster secret", "worker:3")},
      {"a changed digit", tampered},
      {"another task's name on this one's MAC", renamed},
      {"the cluster token itself", cluster},
      {"no MAC", "task:worker:3"},
      {"no task", "task::" + token.substr(token.rfind(':') + 1)},
      {"empty", ""},
  };
  for (const Case& c : refused) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(TaskOfToken(c.token, cluster), std::nullopt);
  }
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer ab"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
