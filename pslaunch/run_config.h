// The effective config of a pslaunch run: the config after the command-line
// overrides, written to the run's directory for every task to read, and
// rewritten with the ports the PS tasks whose address has port 0 bound.
#ifndef PST_PSLAUNCH_RUN_CONFIG_H_
#define PST_PSLAUNCH_RUN_CONFIG_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cluster/membership/local_etcd.h"
#include "config.pb.h"
#include "pslaunch/supervisor.h"

namespace pst {

// pslaunch's exit code when a stop request (Ctrl-C, SIGTERM) ended the run.
inline constexpr int kInterruptedExitCode = 130;

// Writes `config` as <dir>/cluster.textproto and returns that path.
absl::StatusOr<std::string> WriteEffectiveConfig(const JobConfig& config,
                                                 const std::string& dir);

// The PS tasks whose address has port 0: each writes the port it got to its
// file in `dir`, a temporary directory of this run (none when no address
// has port 0).
struct PendingPorts {
  std::string dir;
  // Task name -> its --port_file: "ps:<i>" for shard i's primary
  // (cluster.ps[i]), "ps:<i>:<k>" for its backup k
  // (cluster.ps_backups[i].address[k-1]).
  std::map<std::string, std::string> files;
};
absl::StatusOr<PendingPorts> PortFiles(const JobConfig& config);

// In a job with backups every replica must know the others' addresses from
// its start (a backup that takes over forwards to the replica it replaced,
// restarted), so each PS address with port 0 gets a free port of this host
// now, before any task starts; the tasks then bind those. Does nothing for
// a job without backups, whose tasks report the ports they got.
absl::Status PickReplicaPorts(JobConfig* config);

// A job with backups keeps its shards' membership in etcd: where the config
// names none, an etcd of the job's own (data and log under `dir`/etcd),
// whose endpoint goes into the config; it dies with pslaunch. Null where
// none is needed.
absl::StatusOr<std::unique_ptr<LocalEtcd>> StartJobEtcd(JobConfig* config, const std::string& dir);

// Why the PS tasks' ports could not be resolved: pslaunch's exit code and
// the line to print once every task is stopped.
struct PortFailure {
  int exit_code;
  std::string line;
};

// The name of replica `replica` of shard `shard` as a task: "ps:<shard>"
// for the primary, "ps:<shard>:<replica>" for a backup.
std::string PsTaskName(int shard, int replica);
// Whether `task` names a shard's backup ("ps:<i>:<k>").
bool IsPsBackupTask(const std::string& task);

// Waits until every PS in `pending` has reported the port it got, then
// gives those addresses their ports in `config` and rewrites the effective
// config in `dir`, which the workers and restarted PS tasks read. A PS that
// exits, a stop request or the end of `timeout_seconds`
// (--port_timeout_seconds) ends the wait with a PortFailure.
std::optional<PortFailure> ResolvePorts(const PendingPorts& pending, int timeout_seconds,
                                        Supervisor* supervisor, JobConfig* config,
                                        const std::string& dir);

}  // namespace pst

#endif  // PST_PSLAUNCH_RUN_CONFIG_H_
