// Where a replicated shard's replicas keep their checkpoints under a job's
// training.checkpoint.dir `root`: replica 0 in <root>/shard-<i>/, as an
// unreplicated shard does, and a backup k in <root>/replica-<k>/shard-<i>/
// (its final checkpoint, and those it writes once it holds the office).
//
// Within a run a shard's versions only grow, across failovers too (replica
// 0 restores the newest of these folders), so of their checkpoints of one
// run the latest version holds the most of it; a replica away or still
// catching up when the run ended holds an older one. One version number
// can be written twice: by a primary that died before its backups held
// that version, and by the backup that took over at a higher epoch and
// made the version again, which is the run's.
#ifndef PST_PS_SERVER_CORE_REPLICA_CHECKPOINT_DIRS_H_
#define PST_PS_SERVER_CORE_REPLICA_CHECKPOINT_DIRS_H_

#include <string>
#include <vector>

#include "ps.pb.h"

namespace pst {

// The training.checkpoint.dir replica `replica` writes under: `root` for
// replica 0, <root>/replica-<replica> for a backup.
std::string ReplicaCheckpointRoot(const std::string& root, int replica);

// The backups' roots that exist under `root` (<root>/replica-<k>, k >= 1,
// named as ReplicaCheckpointRoot names them), by k.
std::vector<std::string> BackupCheckpointRoots(const std::string& root);

// The shard a folder named shard-<i> under a root holds checkpoints of, as
// ReplicaCheckpointDirs names it; -1 for any other name ("shard-03" too).
int ShardOfCheckpointFolder(const std::string& name);

// The folders of shard `shard`'s replicas: replica 0's <root>/shard-<shard>
// first (whether or not it exists), then each backup's that exists, by k.
std::vector<std::string> ReplicaCheckpointDirs(const std::string& root, int shard);

// Whether `b` holds more of a run than `a`, both checkpoints of one shard
// of it: a later version, or the same version at a later epoch.
bool HoldsMoreOfTheRun(const ShardCheckpoint& a, const ShardCheckpoint& b);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_REPLICA_CHECKPOINT_DIRS_H_
