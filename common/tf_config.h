// TF_CONFIG: the cluster description that TensorFlow's launchers (Kubeflow's
// TFJob, SageMaker, in-house schedulers) give every process in an environment
// variable, read as the cluster part of the job config.
//
//   {"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]},
//    "task": {"type": "worker", "index": 1}}
//
// Mapping: cluster.ps is TF_CONFIG's "ps" list, in order; the workers are the
// "chief" (or its older name "master", at most one) followed by "worker", so
// that chief:0 is worker:0 (the chief) and worker:i is worker:i+1 when there
// is a chief (worker:i otherwise); cluster.workers is their number. Workers
// only dial out, so their addresses are counted, not used. An "evaluator"
// entry in the cluster is left alone (it is outside the training cluster in
// TensorFlow too), but a process whose own task is the evaluator is refused:
// the chief evaluates the model after every epoch. "environment" and
// "rpc_layer" are ignored.
//
// torchrun's environment (also Kubeflow's PyTorchJob's) describes a cluster
// of workers only: WORLD_SIZE workers, this process being worker:RANK. Its
// shards are PSTRAIN_PS (comma-separated host:port, in shard order), else
// PSTRAIN_NUM_PS shards (default 1) on the MASTER_ADDR host at ports
// MASTER_PORT+1, MASTER_PORT+2, ...: a ps_server started beside the rank-0
// process (a sidecar of the PyTorchJob's master pod) with --task=ps:<i>.
// Without PSTRAIN_PS or MASTER_ADDR (pslaunch's workers, which get RANK
// and WORLD_SIZE with a config) it describes nothing.
//
// Replicated shards (cluster.ps_backups) in either environment:
// PSTRAIN_PS_REPLICAS=R (default 1) makes each shard R replicas, its primary
// and R-1 backups. The ps list (TF_CONFIG's "ps", PSTRAIN_PS, or the ports
// beside the master) then holds N*R addresses, replica-major: the first N
// are the shards' primaries (cluster.ps), the next N their first backups
// (ps_backups[i].address[0]), and so on. TF_CONFIG's task ps:j is replica
// j / N of shard j % N, so a TFJob's N*R PS replicas each find their place.
// PSTRAIN_ETCD (comma-separated host:port) names the etcd that holds the
// shards' membership (cluster.membership.etcd_endpoints).
#ifndef PST_COMMON_TF_CONFIG_H_
#define PST_COMMON_TF_CONFIG_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "config.pb.h"

namespace pst {

inline constexpr char kTfConfigVariable[] = "TF_CONFIG";
inline constexpr char kPsReplicasVariable[] = "PSTRAIN_PS_REPLICAS";
inline constexpr char kEtcdVariable[] = "PSTRAIN_ETCD";

// A launcher's cluster in this project's terms.
struct TfConfig {
  std::vector<std::string> ps;   // cluster.ps
  // cluster.ps_backups: empty, or per shard its R-1 backups' addresses.
  std::vector<std::vector<std::string>> ps_backups;
  std::vector<std::string> etcd_endpoints;  // cluster.membership.etcd_endpoints
  int workers = 0;               // cluster.workers: chief + worker entries
  std::optional<TaskId> task;    // this process's task, when the environment names one
  int replica = 0;               // of task's shard, when task is a ps task
  std::string source = kTfConfigVariable;  // where it came from, for messages
};

// InvalidArgument, naming TF_CONFIG and the offending part, unless `json` is
// an object with a "cluster" object of lists of "host:port" strings holding
// at least one ps and one worker (or chief), and optionally a "task" object
// with a known "type" and an "index" within its list. `replicas` per shard:
// PSTRAIN_PS_REPLICAS (see above); the ps list must be a multiple of it.
absl::StatusOr<TfConfig> ParseTfConfig(absl::string_view json, int replicas = 1);

// The process's TF_CONFIG, parsed; nullopt when it is unset or empty.
absl::StatusOr<std::optional<TfConfig>> TfConfigFromEnvironment();

// torchrun's environment as read through `getenv`; nullopt where it names
// no shards (see above). InvalidArgument naming the variable for a
// WORLD_SIZE, RANK, MASTER_PORT, PSTRAIN_NUM_PS or PSTRAIN_PS that is not
// what it must be (PSTRAIN_PS_REPLICAS and PSTRAIN_ETCD too).
absl::StatusOr<std::optional<TfConfig>> ParseTorchEnvironment(
    const std::function<const char*(const char*)>& getenv);

// The launcher's cluster: TF_CONFIG where it is set, else torchrun's
// environment, else nullopt.
absl::StatusOr<std::optional<TfConfig>> ClusterFromEnvironment();

// Fills config->cluster's ps addresses, backups, etcd endpoints and worker
// count from `tf` where the config (file and flag overrides) leaves them
// empty, and checks that it agrees with `tf` where it does not:
// InvalidArgument naming both (`tf`'s source and `origin`, the config file)
// otherwise.
absl::Status ApplyTfConfig(const TfConfig& tf, absl::string_view origin, JobConfig* config);

// This process's task: `task_flag` (--task; empty when not given), else
// TF_CONFIG's task, else `fallback`. InvalidArgument when --task and
// TF_CONFIG's task differ, or when the task is not of kind `runs` (naming
// the program `program` runs the other kind).
absl::StatusOr<TaskId> ResolveTask(absl::string_view task_flag, const std::optional<TfConfig>& tf,
                                   TaskId::Kind runs, absl::string_view program);

// This shard replica's place: `replica_flag` (--replica) where given, else
// the environment's (TF_CONFIG's task ps:j with PSTRAIN_PS_REPLICAS), else 0
// (the primary). InvalidArgument when --replica and TF_CONFIG differ.
absl::StatusOr<int> ResolveReplica(std::optional<int> replica_flag,
                                   const std::optional<TfConfig>& tf);

// ResolveReplica with the process's ClusterFromEnvironment.
absl::StatusOr<int> ResolveReplicaFromEnvironment(std::optional<int> replica_flag);

// ResolveTask with the process's ClusterFromEnvironment and fallback task
// `runs`:0. torchrun's RANK names a worker's task only: a ps_server under
// torchrun takes --task.
absl::StatusOr<TaskId> ResolveTaskFromEnvironment(absl::string_view task_flag,
                                                  TaskId::Kind runs,
                                                  absl::string_view program);

// InvalidArgument when TF_CONFIG is set: it gives each process its own task,
// while a launcher (pslaunch) starts every task of the cluster itself.
absl::Status CheckTfConfigUnset(absl::string_view launcher);

}  // namespace pst

#endif  // PST_COMMON_TF_CONFIG_H_
