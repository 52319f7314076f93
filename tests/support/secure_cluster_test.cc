#include "tests/support/secure_cluster_test.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace pst {

std::string* SecureClusterTest::dir_ = nullptr;
TestCertificates* SecureClusterTest::certs_ = nullptr;

void SecureClusterTest::SetUpTestSuite() {
  const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
  const std::string name = suite != nullptr ? suite->name() : "secure_cluster";
  dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/", name, ".", getpid()));
  std::filesystem::create_directories(*dir_);
  absl::StatusOr<TestCertificates> certs = MakeTestCertificates(*dir_);
  ASSERT_TRUE(certs.ok()) << certs.status();
  certs_ = new TestCertificates(*certs);
}

void SecureClusterTest::TearDownTestSuite() {
  std::filesystem::remove_all(*dir_);
  delete certs_;
  delete dir_;
  certs_ = nullptr;
  dir_ = nullptr;
}

void SecureClusterTest::SetUp() {
  ASSERT_NE(certs_, nullptr) << "the suite's certificates could not be made";
  setenv(token_env_.c_str(), "s3cret-token", 1);
}

void SecureClusterTest::TearDown() { unsetenv(token_env_.c_str()); }

ClusterConfig SecureClusterTest::SecureCluster(bool require_client_cert) const {
  ClusterConfig cluster;
  TlsConfig* tls = cluster.mutable_tls();
  tls->set_ca(certs_->ca);
  tls->set_cert(certs_->cert);
  tls->set_key(certs_->key);
  tls->set_require_client_cert(require_client_cert);
  cluster.mutable_auth()->set_token_env(token_env_);
  return cluster;
}

}  // namespace pst
