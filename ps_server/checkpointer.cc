#include "ps_server/checkpointer.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ps_server/checkpoint.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

constexpr int kDefaultKeep = 3;
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

}  // namespace

Checkpointer::Checkpointer(ParameterShard* shard, const CheckpointConfig& config, int index)
    : shard_(shard), config_(config), dir_(absl::StrCat(config.dir(), "/shard-", index)) {}

Checkpointer::~Checkpointer() {
  if (thread_.joinable()) {
    stop_.Notify();
    thread_.join();
  }
}

absl::StatusOr<int64_t> Checkpointer::RestoreNewest() {
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dir_, &rejected);
  for (const std::string& reason : rejected) {
    spdlog::error("{}; falling back to an older checkpoint", reason);
  }
  if (!checkpoint.ok()) return checkpoint.status();
  if (absl::Status s = shard_->Restore(*checkpoint); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  last_version_ = checkpoint->version();
  return checkpoint->version();
}

absl::StatusOr<Checkpointer::Written> Checkpointer::CheckpointNow() {
  return Write(shard_->Snapshot());
}

absl::StatusOr<Checkpointer::Written> Checkpointer::Write(const ShardCheckpoint& checkpoint) {
  absl::MutexLock lock(&mu_);
  if (checkpoint.variables_size() == 0) {
    return absl::FailedPreconditionError("nothing to checkpoint: the shard is not initialized");
  }
  absl::StatusOr<std::string> path =
      WriteCheckpoint(dir_, checkpoint, config_.keep() > 0 ? config_.keep() : kDefaultKeep);
  if (!path.ok()) {
    spdlog::error("checkpoint at version {} failed: {}", checkpoint.version(),
                  std::string(path.status().message()));
    return path.status();
  }
  last_version_ = checkpoint.version();
  spdlog::info("checkpoint at version {}: {}", checkpoint.version(), *path);
  return Written{*path, checkpoint.version()};
}

void Checkpointer::Start() {
  if (config_.dir().empty() || (config_.every_steps() <= 0 && config_.every_seconds() <= 0)) return;
  if (config_.every_steps() > 0) shard_->AttachCheckpointWriter();
  thread_ = std::thread([this] { Loop(); });
}

void Checkpointer::Loop() {
  absl::Time last_time = absl::Now();
  while (!stop_.HasBeenNotified()) {
    // Step-driven checkpoints: the shard copies its state exactly when the
    // version reaches a multiple of every_steps; we only write it out.
    if (std::optional<ShardCheckpoint> snapshot =
            shard_->TakeScheduledSnapshot(absl::Now() + kPollInterval)) {
      Write(*snapshot).IgnoreError();  // logged; the next one tries again
      shard_->ScheduledSnapshotWritten();
      last_time = absl::Now();
      continue;
    }
    int64_t last;
    {
      absl::MutexLock lock(&mu_);
      last = last_version_;
    }
    const int64_t version = shard_->version();
    if (config_.every_seconds() > 0 && version != last && version > 0 &&
        absl::Now() - last_time >= absl::Seconds(config_.every_seconds())) {
      CheckpointNow().IgnoreError();
      last_time = absl::Now();
    }
  }
}

void Checkpointer::Stop() {
  if (thread_.joinable()) {
    stop_.Notify();
    thread_.join();
    shard_->DetachCheckpointWriter();
  }
  if (config_.dir().empty()) return;
  int64_t last;
  {
    absl::MutexLock lock(&mu_);
    last = last_version_;
  }
  if (shard_->version() != last) CheckpointNow().IgnoreError();
}

}  // namespace pst
