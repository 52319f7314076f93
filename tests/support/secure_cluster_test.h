// A test suite that secures clusters: throwaway certificates
// (test_certificates.h) made once for the suite under a temporary folder and
// removed after it, and a cluster token the suite's tests find in an
// environment variable of the suite's choosing.
#ifndef PST_TESTS_SUPPORT_SECURE_CLUSTER_TEST_H_
#define PST_TESTS_SUPPORT_SECURE_CLUSTER_TEST_H_

#include <string>

#include "config.pb.h"
#include "gtest/gtest.h"
#include "tests/support/test_certificates.h"

namespace pst {

class SecureClusterTest : public ::testing::Test {
 protected:
  // Sets `token_env` to "s3cret-token" for each test, and unsets it after.
  explicit SecureClusterTest(std::string token_env) : token_env_(std::move(token_env)) {}

  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;
  void TearDown() override;

  // The suite's folder, where its certificates lie and tests may write.
  static const std::string& dir() { return *dir_; }
  static const TestCertificates& certs() { return *certs_; }
  // cluster.tls from the suite's CA and certificate, cluster.auth from the
  // suite's token variable.
  ClusterConfig SecureCluster(bool require_client_cert) const;
  const std::string& token_env() const { return token_env_; }

 private:
  const std::string token_env_;
  static std::string* dir_;
  static TestCertificates* certs_;
};

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_SECURE_CLUSTER_TEST_H_
