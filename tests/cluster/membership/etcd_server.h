// A real etcd (Debian's /usr/bin/etcd) for one test: a single member on free
// loopback ports with a data directory of its own (in memory where the host
// has it, as pslaunch's: EtcdDataDir), killed by PID when the object goes (a
// test that fails midway leaves no etcd behind).
#ifndef PST_TESTS_CLUSTER_MEMBERSHIP_ETCD_SERVER_H_
#define PST_TESTS_CLUSTER_MEMBERSHIP_ETCD_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cluster/membership/local_etcd.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {

inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

class EtcdServer {
 public:
  // Starts etcd and waits (up to 30 s, polling with a read) until it
  // answers. Its heartbeat and election timeout are cut to 50 and 500 ms,
  // which lowers etcd's minimum lease TTL to 1 s.
  static absl::StatusOr<std::unique_ptr<EtcdServer>> Start();

  // "127.0.0.1:<port>", its client endpoint.
  const std::string& endpoint() const { return endpoint_; }

  // Kills it (SIGKILL: no goodbye to its clients) and reaps it.
  void Kill();
  // Starts it again on the same data directory and ports, and waits until
  // it answers.
  absl::Status Restart();

 private:
  EtcdServer(std::string log_dir, EtcdDataDir data, int client_port, int peer_port);
  absl::Status Launch();

  const std::string log_dir_;
  const EtcdDataDir data_;  // declared before process_: removed after etcd is killed
  const int client_port_;
  const int peer_port_;
  const std::string endpoint_;
  int launches_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

// A suite whose every test has an etcd of its own (`etcd_`), started in
// SetUp; a failure naming the package where /usr/bin/etcd is not installed.
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override;

  std::unique_ptr<EtcdServer> etcd_;
};

}  // namespace pst

#endif  // PST_TESTS_CLUSTER_MEMBERSHIP_ETCD_SERVER_H_
