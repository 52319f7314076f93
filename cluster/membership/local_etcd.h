// An etcd of one job's own on this host (Debian's /usr/bin/etcd): one
// member on free loopback ports, its data in a directory of the caller's,
// killed when the object goes or the process that started it dies
// (PR_SET_PDEATHSIG), so that no etcd outlives its launcher. What pslaunch
// runs for a job with backups whose config names no etcd.
//
// Its heartbeat and election timeout are cut to 50 and 500 ms, which lowers
// etcd's minimum lease to 1 s: a backup may take over a second after its
// primary died. Its data lives in memory where the host has a tmpfs
// (EtcdDataDir).
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

// A directory for the data of an etcd that lives no longer than its job:
// in memory (a fresh directory under /dev/shm) where this host has it, else
// `fallback` itself. Why: etcd syncs its log to disk on every write, and on
// a disk that other processes keep busy one sync can outlast a 1 s lease,
// which deposes a healthy primary (failovers of 0.7-4.3 s measured beside
// writers that sync, against milliseconds to 0.5 s in memory). An etcd of one
// job's own holds nothing that must outlive the host's memory.
//
// The directory is removed with the object. One whose owner died without
// removing it (SIGKILL) is removed by the next EtcdDataDir::Make on the
// host: each owner holds a lock on a file inside its directory, which the
// kernel releases when the owner dies, whatever its PID namespace.
class EtcdDataDir {
 public:
  // `memory_root`: where the in-memory directories go (tests name a
  // scratch directory of their own).
  static EtcdDataDir Make(const std::string& fallback, const std::string& memory_root = "/dev/shm");
  EtcdDataDir(EtcdDataDir&& other) noexcept;
  EtcdDataDir& operator=(EtcdDataDir&&) = delete;
  ~EtcdDataDir();

  const std::string& path() const { return path_; }
  bool in_memory() const { return lock_fd_ >= 0; }

 private:
  EtcdDataDir(std::string path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}

  std::string path_;
  int lock_fd_;  // -1 for the fallback, which the caller owns
};

class LocalEtcd {
 public:
  // Starts etcd with its log (etcd.log) under `dir` and its data in
  // EtcdDataDir::Make(dir), and waits up to `timeout` until it answers a
  // read. FailedPrecondition, naming the package, where etcd is not
  // installed; Unavailable if it does not answer in time (its log's path
  // said).
  static absl::StatusOr<std::unique_ptr<LocalEtcd>> Start(const std::string& dir,
                                                          absl::Duration timeout);
  ~LocalEtcd();  // kills it (SIGKILL) and reaps it
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  // "127.0.0.1:<port>": its client endpoint.
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }

 private:
  LocalEtcd(pid_t pid, std::string endpoint, EtcdDataDir data)
      : pid_(pid), endpoint_(std::move(endpoint)), data_(std::move(data)) {}

  const pid_t pid_;
  const std::string endpoint_;
  EtcdDataDir data_;  // removed after the destructor has killed etcd
};

}  // namespace pst

#endif  // PST_CLUSTER_MEMBERSHIP_LOCAL_ETCD_H_
