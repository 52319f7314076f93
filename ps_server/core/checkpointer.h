// Takes a shard's checkpoints: periodically (every N versions and/or every
// T seconds), on demand, and once more at shutdown; and decides at start
// what the checkpoints already on disk mean for this run.
//
// A PS never silently forgets: at start it restores its run's newest valid
// checkpoint or refuses to start (Prepare), and a write that fails is
// retried with pushes still held, so the newest checkpoint on disk never
// falls more than every_steps versions behind; after
// CheckpointConfig.max_failures consecutive failures the writer gives up
// and the PS must stop.
//
// With CheckpointConfig.full_every > 1 the files form chains (a full one,
// then deltas: checkpoint.h); the shard decides at each capture which
// (ParameterShard::CheckpointSnapshot), and a write that fails makes the
// next one full.
#ifndef PST_PS_SERVER_CORE_CHECKPOINTER_H_
#define PST_PS_SERVER_CORE_CHECKPOINTER_H_

#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/file_lock.h"
#include "config.pb.h"
#include "ps_server/core/parameter_shard.h"

namespace pst {

// Which run a checkpoint belongs to; stamped into every file written.
struct RunIdentity {
  std::string run_id;       // CheckpointConfig.run_id (may be empty)
  std::string config_hash;  // TrainingConfigHash of the job
};

class Checkpointer {
 public:
  // Writes one checkpoint file (WriteCheckpoint); tests substitute failing ones.
  using FileWriter = std::function<absl::StatusOr<std::string>(
      const std::string& dir, const ShardCheckpoint& checkpoint, int keep)>;

  // `shard` must outlive the Checkpointer. Checkpoints go to
  // <config.dir>/shard-<index>/.
  Checkpointer(ParameterShard* shard, const CheckpointConfig& config, int index,
               RunIdentity identity, FileWriter writer = nullptr);
  ~Checkpointer();

  // Before serving: creates the directory and holds it (FileLock::HoldDirectory)
  // while the Checkpointer lives, removes temporary files a crash left,
  // and per `start` restores a checkpoint into the shard or starts fresh
  // (see CheckpointStart). Returns the restored version, or -1 for a
  // fresh start. FailedPrecondition, naming the directory, what is wrong
  // and what to do, when the PS must not start (another live process
  // holds the directory, among others); the directory is then let go.
  absl::StatusOr<int64_t> Prepare(CheckpointStart start);

  // Prepare for a backup, which restores nothing (its state comes from its
  // primary): creates and holds the directory as Prepare does, and removes
  // temporary files; keeps the checkpoints there where the newest is of
  // this run (written in an earlier life of this process's replica, as
  // primary perhaps: replica 0 restores them when the shard lost every
  // replica, NewestOfBackups), and moves them aside otherwise, or where the
  // run has no id to tell.
  absl::Status PrepareBackup();

  // Runs once, on the checkpoint thread, when max_failures consecutive
  // writes have failed; the PS must then stop. Set before Start().
  void set_on_give_up(std::function<void(const absl::Status&)> on_give_up) {
    on_give_up_ = std::move(on_give_up);
  }

  // Starts the periodic thread (no-op when neither interval is set).
  void Start();

  struct Written {
    std::string path;
    int64_t version;
  };
  // Writes a checkpoint of the current state now (one attempt, counted):
  // the next link of the shard's chain.
  absl::StatusOr<Written> CheckpointNow();

  // Stops the thread and writes a final checkpoint if the state moved since
  // the last one (unless the writer gave up).
  void Stop();

 private:
  // Prepare and PrepareBackup, holding the directory from MakeDirectory on.
  absl::StatusOr<int64_t> PrepareHeld(CheckpointStart start);
  absl::Status PrepareBackupHeld();
  void Loop();
  // Writes the scheduled snapshot, retrying with backoff until it lands, the
  // writer gives up, or Stop().
  void WriteScheduled(ShardCheckpoint snapshot);
  absl::StatusOr<Written> Write(ShardCheckpoint checkpoint);
  // Counts a failed attempt; gives up at max_failures. True if it gave up.
  bool CountFailure(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishStats() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MoveAside(const std::vector<std::string>& files);
  // Checks training.checkpoint.dir, makes this shard's folder in it (this
  // user's alone) and removes the temporary files a crash left there.
  absl::Status MakeDirectory();
  struct BackupCheckpoint {
    ShardCheckpoint checkpoint;
    std::string dir;
  };
  // The newest checkpoint a backup of this shard wrote in its folder
  // (ReplicaCheckpointDirs) of the run of `own` (this folder's newest),
  // or, where this folder holds none, of this run; only where it is a
  // later version than `own`.
  std::optional<BackupCheckpoint> NewestOfBackups(const ShardCheckpoint* own) const;

  ParameterShard* shard_;
  const CheckpointConfig config_;
  const int index_;
  const std::string dir_;
  const std::string task_;
  // This PS's hold on dir_ (MakeDirectory): no other process writes,
  // empties or moves aside the checkpoints there while it lives.
  std::optional<FileLock> dir_lock_;
  const RunIdentity identity_;
  const FileWriter writer_;
  std::function<void(const absl::Status&)> on_give_up_;
  absl::Mutex mu_;  // serializes writers
  int64_t last_version_ ABSL_GUARDED_BY(mu_) = -1;
  bool last_finished_ ABSL_GUARDED_BY(mu_) = false;
  bool gave_up_ ABSL_GUARDED_BY(mu_) = false;
  CheckpointStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_CHECKPOINTER_H_
