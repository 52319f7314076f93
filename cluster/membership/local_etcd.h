// An etcd of one job's own on this host (Debian's /usr/bin/etcd): one
// member on free loopback ports, its data in a directory of the caller's,
// killed when the object goes or the process that started it dies
// (PR_SET_PDEATHSIG), so that no etcd outlives its launcher. What pslaunch
// runs for a job with backups whose config names no etcd.
//
// Its heartbeat and election timeout are cut to 50 and 500 ms, which lowers
// etcd's minimum lease to 1 s: a backup may take over a second after its
// primary died.
#ifndef PST_CLUSTER_MEMBERSHIP_LOCAL_ETCD_H_
#define PST_CLUSTER_MEMBERSHIP_LOCAL_ETCD_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pst {

inline constexpr char kEtcdProgram[] = "/usr/bin/etcd";

// `count` distinct free loopback ports outside the ephemeral range
// (common/server_ports.h), released for the caller to bind (another
// process may take one in between; a bind then fails).
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count);

class LocalEtcd {
 public:
  // Starts etcd with its data and log (etcd.log) under `dir` and waits up
  // to `timeout` until it answers a read. FailedPrecondition, naming the
  // package, where etcd is not installed; Unavailable if it does not
  // answer in time (its log's path said).
  static absl::StatusOr<std::unique_ptr<LocalEtcd>> Start(const std::string& dir,
                                                          absl::Duration timeout);
  ~LocalEtcd();  // kills it (SIGKILL) and reaps it
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  // "127.0.0.1:<port>": its client endpoint.
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }

 private:
  LocalEtcd(pid_t pid, std::string endpoint) : pid_(pid), endpoint_(std::move(endpoint)) {}

  const pid_t pid_;
  const std::string endpoint_;
};

}  // namespace pst

#endif  // PST_CLUSTER_MEMBERSHIP_LOCAL_ETCD_H_
