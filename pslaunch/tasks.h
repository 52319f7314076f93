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
  // Shard index -> its --port_file, for the shards whose address has port
  // 0: given on their first start only, since a restart reads the rewritten
  // config, which names the port the shard got.
  std::map<int, std::string> port_files;
};

// "<dir>/worker-<index>.json".
std::string WorkerResultPath(const std::string& dir, int index);

// The tasks of `config`, PS shards first, then workers. Every override
// pslaunch was given goes to each task that takes it (ForwardedFlags,
// common/overrides.h); --metrics_port=P gives the tasks P, P+1, ... in
// that order; with cluster.auth each worker carries its own task token in
// its environment; with cluster.worker_command the workers run that
// command instead of the worker binary. An error only when the cluster
// token cannot be read.
absl::StatusOr<std::vector<ChildSpec>> ClusterTasks(const JobConfig& config,
                                                    const TaskPaths& paths);

}  // namespace pst

#endif  // PST_PSLAUNCH_TASKS_H_
