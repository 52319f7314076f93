#include "tests/support/test_certificates.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

absl::Status Run(const std::string& dir, const std::string& command) {
  std::string log = dir + "/openssl.log";
  std::string line = absl::StrCat("cd ", dir, " && ", command, " >", log, " 2>&1");
  if (std::system(line.c_str()) == 0) return absl::OkStatus();
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  return absl::InternalError(absl::StrCat("`", command, "` failed: ", output.str()));
}

// A CA named `name`: <name>.pem and <name>.key.
absl::Status MakeCa(const std::string& dir, const std::string& name) {
  return Run(dir, absl::StrCat(
                      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
                      "-days 2 -subj /CN=",
                      name, " -keyout ", name, ".key -out ", name, ".pem"));
}

// <name>.pem / <name>.key signed by <ca>, valid for loopback names.
absl::Status MakeLeaf(const std::string& dir, const std::string& name, const std::string& ca) {
  std::ofstream(dir + "/leaf.ext")
      << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
         "extendedKeyUsage=serverAuth,clientAuth\n";
  absl::Status s = Run(dir, absl::StrCat(
                                "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
                                "-nodes -subj /CN=localhost -keyout ",
                                name, ".key -out ", name, ".csr"));
  if (!s.ok()) return s;
  return Run(dir, absl::StrCat("openssl x509 -req -days 2 -in ", name, ".csr -CA ", ca,
                               ".pem -CAkey ", ca, ".key -CAcreateserial -extfile leaf.ext -out ",
                               name, ".pem"));
}

}  // namespace

absl::StatusOr<TestCertificates> MakeTestCertificates(const std::string& dir) {
  for (absl::Status s : {MakeCa(dir, "ca"), MakeLeaf(dir, "node", "ca"), MakeCa(dir, "other_ca"),
                         MakeLeaf(dir, "other_node", "other_ca")}) {
    if (!s.ok()) return s;
  }
  return TestCertificates{dir + "/ca.pem",       dir + "/node.pem",       dir + "/node.key",
                          dir + "/other_ca.pem", dir + "/other_node.pem", dir + "/other_node.key"};
}

}  // namespace pst
