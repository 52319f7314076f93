// The processes pslaunch starts for a cluster config: one ps_server per
// cluster.ps address and one worker per cluster.workers, each with its
// command line, environment and first-start arguments.
#ifndef PST_PSLAUNCH_TASKS_H_
#define PST_PSLAUNCH_TASKS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config.pb.h"
#include "pslaunch/supervisor.h"

namespace pst {

// Where the tasks of one run find their programs and files.
struct TaskPaths {
  std::string bin_dir;      // holds ps_server and worker
  std::string config_path;  // the effective config every task reads
  std::string result_dir;   // each worker writes WorkerResultPath(result_dir, i)
  // Task name (PsTaskName) -> its --port_file, for the shards' replicas
  // whose address has port 0: given on their first start only, since a
  // restart reads the rewritten config, which names the port it got.
  std::map<std::string, std::string> port_files;
  // With both set, each shard sits behind the HTTP/2 relay: nghttpx at
  // `relay_binary` with the configuration file `relay_conf`.
  std::string relay_binary;
  std::string relay_conf;
};

// "<dir>/worker-<index>.json".
std::string WorkerResultPath(const std::string& dir, int index);

// With a relay, shard i listens at the socket file RelaySocketPath(
// result_dir, i) (mode 0600) and a task relay:i, nghttpx, at cluster.ps[i]
// in front of it, with cluster.tls's files on both of its sides.
std::string RelaySocketPath(const std::string& dir, int shard);

// The tasks of `config`: the shards' backups (ps:<i>:<k>, for
// cluster.ps_backups), then the PS shards (each followed by its relay, if
// any), then workers; so a primary starts once its backups listen, and
// the workers once the primaries do. Every override
// pslaunch was given goes to each task that takes it (ForwardedFlags,
// common/overrides.h); --metrics_port=P gives the tasks P, P+1, ... in
// that order (a relay serves no metrics and takes none); with cluster.auth each worker carries its
// own task token in its environment; with cluster.worker_command the workers run that command
// instead of the worker binary. An error when the cluster token cannot be read, or
// (InvalidArgument) a relay is asked for a shard whose address has no fixed port.
absl::StatusOr<std::vector<ChildSpec>> ClusterTasks(const JobConfig& config,
                                                    const TaskPaths& paths);

}  // namespace pst

#endif  // PST_PSLAUNCH_TASKS_H_
