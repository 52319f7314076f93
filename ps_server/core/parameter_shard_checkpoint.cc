// ParameterShard's checkpoints: the snapshot of its whole state, the
// snapshots scheduled every snapshot_every_steps with their writer's
// backpressure (ps_server/core/snapshot_schedule.h), and Restore.
#include "common/status_macros.h"
#include "ps_server/core/parameter_shard.h"

namespace pst {

void ParameterShard::SetCheckpointStats(const CheckpointStats& stats) {
  absl::MutexLock lock(&mu_);
  snapshots_.set_stats(stats);
}

ShardCheckpoint ParameterShard::PresizedCheckpoint() const {
  std::vector<std::pair<size_t, size_t>> bytes;
  {
    absl::MutexLock lock(&mu_);
    bytes = tables_.dense().store().ExportBytes();
  }
  ShardCheckpoint presized;
  VariableStore::PresizeExport(bytes, &presized);
  return presized;
}

ShardCheckpoint ParameterShard::Snapshot() const {
  ShardCheckpoint presized = PresizedCheckpoint();
  ShardSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = SnapshotLocked(CaptureKind::kWhole, std::move(presized));
  }
  return std::move(snapshot).Finish();  // the tables' views, outside the lock
}

ShardCheckpoint ParameterShard::CheckpointSnapshot() {
  ShardCheckpoint presized = PresizedCheckpoint();
  ShardSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = ChainSnapshotLocked(std::move(presized));
  }
  return std::move(snapshot).Finish();
}

void ParameterShard::RestartCheckpointChain() {
  absl::MutexLock lock(&mu_);
  chain_ = CheckpointChain();
}

ShardSnapshot ParameterShard::ChainSnapshotLocked(ShardCheckpoint presized) {
  if (options_.checkpoint_full_every <= 1) {
    return SnapshotLocked(CaptureKind::kWhole, std::move(presized));
  }
  // A delta needs a link before it at an older version, a chain not yet
  // full_every links long, and every change since that link tracked.
  const bool delta = chain_.parent >= 0 && chain_.parent < version_ &&
                     chain_.links < options_.checkpoint_full_every &&
                     tables_.embeddings().TracksChanges();
  if (!delta) {
    chain_ = {.parent = version_, .base = version_, .links = 1};
    return SnapshotLocked(CaptureKind::kChainStart, std::move(presized));
  }
  ShardSnapshot snapshot = SnapshotLocked(CaptureKind::kChainDelta, std::move(presized));
  snapshot.checkpoint.set_delta(true);
  snapshot.checkpoint.set_parent_version(chain_.parent);
  snapshot.checkpoint.set_base_version(chain_.base);
  chain_.parent = version_;
  ++chain_.links;
  return snapshot;
}

void ParameterShard::AttachCheckpointWriter() {
  absl::MutexLock lock(&mu_);
  snapshots_.AttachWriter();
}

void ParameterShard::DetachCheckpointWriter() {
  absl::MutexLock lock(&mu_);
  snapshots_.DetachWriter();
  // A link scheduled but not taken is never written: the next checkpoint
  // (the final one) starts a chain.
  chain_ = CheckpointChain();
  Changed();
}

void ParameterShard::ScheduledSnapshotWritten() {
  absl::MutexLock lock(&mu_);
  snapshots_.Written();
  Changed();
}

std::optional<ShardCheckpoint> ParameterShard::TakeScheduledSnapshot(absl::Time deadline) {
  std::optional<ShardSnapshot> snapshot;
  {
    absl::MutexLock lock(&mu_);
    snapshot = snapshots_.Take(deadline, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return shutting_down_;  // read with mu_ held: Take waits on it
    });
  }
  if (!snapshot) return std::nullopt;
  return std::move(*snapshot).Finish();
}

ShardSnapshot ParameterShard::SnapshotLocked(CaptureKind kind, ShardCheckpoint presized) const {
  const absl::Time start = absl::Now();
  ShardSnapshot snapshot;
  snapshot.kind = kind;
  snapshot.checkpoint = std::move(presized);
  snapshot.checkpoint.set_shard(options_.shard);
  snapshot.checkpoint.set_version(version_);
  snapshot.checkpoint.set_epoch(epoch_);
  tables_.Capture(&snapshot);
  ledger_.ExportClocks(&snapshot.checkpoint);
  last_capture_ = absl::Now() - start;
  return snapshot;
}

absl::Status ParameterShard::Restore(const ShardCheckpoint& checkpoint) {
  absl::MutexLock lock(&mu_);
  if (tables_.initialized()) {
    return absl::FailedPreconditionError("the shard already holds variables; restore only at start");
  }
  // An elected shard restores before any office, as every replica starts.
  if (!(options_.elected && epoch_ == 0)) PST_RETURN_IF_ERROR(CheckPrimary());
  PST_RETURN_IF_ERROR(tables_.Restore(checkpoint));
  reads_ahead_.store(tables_.embeddings().ReadsAhead());
  version_ = checkpoint.version();
  chain_ = CheckpointChain();  // the restored tables tracked nothing: a full link first
  ledger_.RestoreClocks(checkpoint);
  RestartForwarding();
  Changed();
  return absl::OkStatus();
}

}  // namespace pst
