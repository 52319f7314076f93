// Throwaway certificates for TLS tests, made with the openssl command line:
// a CA, a certificate it signs for 127.0.0.1 / localhost (usable by servers
// and clients alike), and a second, unrelated CA with its own certificate.
#ifndef PST_TESTS_SUPPORT_TEST_CERTIFICATES_H_
#define PST_TESTS_SUPPORT_TEST_CERTIFICATES_H_

#include <string>

#include "absl/status/statusor.h"

namespace pst {

struct TestCertificates {
  std::string ca;          // PEM file paths
  std::string cert;
  std::string key;
  std::string other_ca;    // a CA that did not sign `cert`
  std::string other_cert;  // signed by other_ca, also for 127.0.0.1 / localhost
  std::string other_key;
};

// Creates the files under `dir` (which must exist). Internal error with
// openssl's output if a command fails.
absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir);

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_TEST_CERTIFICATES_H_
