#include "ps_server/core/checkpointer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "ps_server/core/checkpoint.h"
#include "ps_server/core/model_share.h"
#include "ps_server/core/replica_checkpoint_dirs.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

constexpr int kDefaultKeep = 3;
constexpr int kDefaultMaxFailures = 3;
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);
constexpr absl::Duration kFirstRetry = absl::Milliseconds(250);
constexpr absl::Duration kLongestRetry = absl::Seconds(5);
constexpr char kPreviousRunDir[] = "previous";

std::string Describe(const ShardCheckpoint& checkpoint) {
  return absl::StrCat("version ", checkpoint.version(),
                      checkpoint.run_id().empty() ? "" : absl::StrCat(", run ", checkpoint.run_id()),
                      checkpoint.finished() ? ", finished: every worker was done" : "");
}

// FailedPrecondition unless `dir` is a directory that not every user can
// write to (a sticky one, as /tmp, excepted: others cannot replace what is
// in it); the shard's own folder (`made_here`: the PS makes it) must
// besides be no link, and this user's or root's. Otherwise another user
// could put checkpoints there for the PS to restore, or swap the folder
// for a link to one of this user's. The folder the config names may be a
// link, and anyone's (a volume mounted for the PS) short of that.
absl::Status CheckOwnDirectory(const std::string& dir, bool made_here) {
  struct stat status;
  if ((made_here ? lstat(dir.c_str(), &status) : stat(dir.c_str(), &status)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot inspect checkpoint directory ", dir, ": ", std::strerror(errno)));
  }
  const auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", dir, " ", why,
        "; checkpoints are restored into the model, so the folder must be this user's alone: "
        "choose another training.checkpoint.dir"));
  };
  if (S_ISLNK(status.st_mode)) return refuse("is a symbolic link");
  if (!S_ISDIR(status.st_mode)) return refuse("is not a directory");
  if (made_here && status.st_uid != geteuid() && status.st_uid != 0) {
    return refuse(absl::StrCat("belongs to uid ", status.st_uid, ", not to this user (uid ",
                               geteuid(), ")"));
  }
  if ((status.st_mode & S_IWOTH) != 0 && (status.st_mode & S_ISVTX) == 0) {
    return refuse("can be written by any user");
  }
  return absl::OkStatus();
}

}  // namespace

Checkpointer::Checkpointer(ParameterShard* shard, const CheckpointConfig& config, int index,
                           RunIdentity identity, FileWriter writer)
    : shard_(shard),
      config_(config),
      index_(index),
      dir_(absl::StrCat(config.dir(), "/shard-", index)),
      task_(absl::StrCat("ps:", index)),
      identity_(std::move(identity)),
      writer_(writer
                  ? std::move(writer)
                  : FileWriter([](const std::string& dir, const ShardCheckpoint& checkpoint,
                                  int keep) { return WriteCheckpoint(dir, checkpoint, keep); })) {
  absl::MutexLock lock(&mu_);
  stats_.set_version(-1);
  stats_.set_restored_version(-1);
  PublishStats();
}

Checkpointer::~Checkpointer() {
  if (thread_.joinable()) {
    stop_.Notify();
    thread_.join();
  }
}

absl::Status Checkpointer::MoveAside(const std::vector<std::string>& files) {
  const std::string previous = absl::StrCat(dir_, "/", kPreviousRunDir);
  std::error_code error;
  std::filesystem::remove_all(previous, error);
  std::filesystem::create_directories(previous, error);
  for (const std::string& file : files) {
    if (!error) {
      std::filesystem::rename(
          file, absl::StrCat(previous, "/", std::filesystem::path(file).filename().string()), error);
    }
  }
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot move the checkpoints in ", dir_, " aside to ", previous, ": ", error.message()));
  }
  spdlog::info("{} starts fresh: moved {} checkpoint(s) found in {} to {}", task_, files.size(),
               dir_, previous);
  return absl::OkStatus();
}

std::optional<Checkpointer::BackupCheckpoint> Checkpointer::NewestOfBackups(
    const ShardCheckpoint* own) const {
  std::optional<BackupCheckpoint> newest;
  const std::vector<std::string> dirs = ReplicaCheckpointDirs(config_.dir(), index_);
  for (size_t k = 1; k < dirs.size(); ++k) {
    // Held to what this folder is held to: another user's could hold
    // checkpoints put there for this PS to restore.
    absl::Status own_enough = CheckOwnDirectory(
        std::filesystem::path(dirs[k]).parent_path().string(), /*made_here=*/false);
    if (own_enough.ok()) own_enough = CheckOwnDirectory(dirs[k], /*made_here=*/true);
    if (!own_enough.ok()) {
      spdlog::warn("{} leaves the checkpoints in {} alone: {}", task_, dirs[k],
                   std::string(own_enough.message()));
      continue;
    }
    std::vector<std::string> rejected;
    absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dirs[k], &rejected);
    if (!checkpoint.ok()) continue;
    const bool of_the_run = own != nullptr ? checkpoint->run_id() == own->run_id() &&
                                                 checkpoint->config_hash() == own->config_hash()
                                           : !identity_.run_id.empty() &&
                                                 checkpoint->run_id() == identity_.run_id &&
                                                 checkpoint->config_hash() == identity_.config_hash;
    const ShardCheckpoint* latest = newest ? &newest->checkpoint : own;
    if (of_the_run && (latest == nullptr || HoldsMoreOfTheRun(*latest, *checkpoint))) {
      newest = BackupCheckpoint{*std::move(checkpoint), dirs[k]};
    }
  }
  return newest;
}

absl::Status Checkpointer::MakeDirectory() {
  if (absl::Status s = CheckWritableDirectory(config_.dir(), "training.checkpoint.dir"); !s.ok()) {
    return s;
  }
  // What restores the model must be this user's alone: checked before the
  // folder is made (a link in its place is named as such) and after.
  if (struct stat existing; lstat(dir_.c_str(), &existing) == 0) {
    PST_RETURN_IF_ERROR(CheckOwnDirectory(dir_, /*made_here=*/true));
  }
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create checkpoint directory ", dir_, ": ", error.message()));
  }
  PST_RETURN_IF_ERROR(CheckOwnDirectory(config_.dir(), /*made_here=*/false));
  PST_RETURN_IF_ERROR(CheckOwnDirectory(dir_, /*made_here=*/true));
  if (!dir_lock_.has_value()) {
    // Before anything in the folder is removed or moved aside: it may be a
    // live PS's, given the same folder by mistake.
    PST_ASSIGN_OR_RETURN(FileLock lock, FileLock::HoldDirectory(dir_, "the checkpoint folder"));
    dir_lock_.emplace(std::move(lock));
  }
  if (int removed = RemoveTemporaryFiles(dir_); removed > 0) {
    spdlog::warn("{} removed {} unfinished checkpoint file(s) from {}", task_, removed, dir_);
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::PrepareBackup() {
  absl::Status prepared = PrepareBackupHeld();
  if (!prepared.ok()) dir_lock_.reset();  // a PS that may not start holds no folder
  return prepared;
}

absl::Status Checkpointer::PrepareBackupHeld() {
  if (config_.dir().empty()) return absl::OkStatus();
  PST_RETURN_IF_ERROR(MakeDirectory());
  const std::vector<std::string> files = ListCheckpoints(dir_);
  if (files.empty()) return absl::OkStatus();
  absl::StatusOr<ShardCheckpoint> newest = ReadCheckpointHead(files.front());
  if (newest.ok() && !identity_.run_id.empty() && newest->run_id() == identity_.run_id &&
      newest->config_hash() == identity_.config_hash) {
    spdlog::info("{} keeps the {} checkpoint(s) of this run in {} (newest: {})", task_,
                 files.size(), dir_, Describe(*newest));
    return absl::OkStatus();
  }
  return MoveAside(files);
}

absl::StatusOr<int64_t> Checkpointer::Prepare(CheckpointStart start) {
  absl::StatusOr<int64_t> prepared = PrepareHeld(start);
  if (!prepared.ok()) dir_lock_.reset();  // a PS that may not start holds no folder
  return prepared;
}

absl::StatusOr<int64_t> Checkpointer::PrepareHeld(CheckpointStart start) {
  const bool other_model_allowed = start == CheckpointStart::kRestoreOtherModel;
  if (other_model_allowed) start = CheckpointStart::kRestore;
  if (config_.dir().empty()) {
    if (start == CheckpointStart::kRestore) {
      return absl::FailedPreconditionError(
          "--checkpoint_start=restore needs training.checkpoint.dir in the config");
    }
    return -1;
  }
  PST_RETURN_IF_ERROR(MakeDirectory());
  const std::vector<std::string> files = ListCheckpoints(dir_);
  if (start == CheckpointStart::kFresh) {
    if (!files.empty()) {
      PST_RETURN_IF_ERROR(MoveAside(files));
    }
    return -1;
  }
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint =
      files.empty() ? absl::StatusOr<ShardCheckpoint>(absl::NotFoundError("no checkpoint"))
                    : ReadNewestValidCheckpoint(dir_, &rejected);
  for (const std::string& reason : rejected) spdlog::error("{}; trying an older one", reason);
  if (!files.empty() && !checkpoint.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir_, " holds ", files.size(), " checkpoint file(s) and none restores (newest: ",
        rejected.empty() ? checkpoint.status().message() : rejected.front(),
        "); repair or remove them, or start over with --checkpoint_start=fresh"));
  }
  // A backup that took the office wrote the shard's later checkpoints to a
  // folder of its own: restoring this folder's would lose them.
  std::string from = dir_;
  if (std::optional<BackupCheckpoint> newer =
          NewestOfBackups(checkpoint.ok() ? &*checkpoint : nullptr)) {
    spdlog::warn("{} restores {} from {}, a backup's folder, later than its own ({})", task_,
                 Describe(newer->checkpoint), newer->dir,
                 checkpoint.ok() ? absl::StrCat(dir_, " holds ", Describe(*checkpoint))
                                 : absl::StrCat(dir_, " holds none"));
    checkpoint = std::move(newer->checkpoint);
    from = std::move(newer->dir);
  }
  if (!checkpoint.ok()) {
    if (start == CheckpointStart::kRestore) {
      return absl::FailedPreconditionError(absl::StrCat("--checkpoint_start=restore, but ", dir_,
                                                        " holds no checkpoint to restore"));
    }
    return -1;
  }
  const std::string other_choices =
      "resume it with --checkpoint_start=restore, or start over with --checkpoint_start=fresh "
      "(which moves these checkpoints aside)";
  if (start == CheckpointStart::kAuto) {
    if (checkpoint->config_hash() != identity_.config_hash) {
      return absl::FailedPreconditionError(
          absl::StrCat(from, " holds the checkpoints of another job (", Describe(*checkpoint),
                       "; its training config differs from this one); ", other_choices));
    }
    if (checkpoint->run_id() != identity_.run_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          from, " holds the checkpoints of another run (", Describe(*checkpoint),
          identity_.run_id.empty() ? "" : absl::StrCat("; this is run ", identity_.run_id), "); ",
          other_choices));
    }
    if (checkpoint->finished() && identity_.run_id.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          from, " holds the final checkpoint of a finished run (", Describe(*checkpoint),
          "); train again with --checkpoint_start=fresh (which moves it aside), or load it "
          "with --checkpoint_start=restore"));
    }
  }
  if (start == CheckpointStart::kRestore && !other_model_allowed && shard_->model_share()) {
    if (absl::Status s = CheckCheckpointIsShare(*checkpoint, *shard_->model_share()); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint in ", from, " (", Describe(*checkpoint),
          ") holds another model than the config's: ", s.message(),
          "; restore it all the same with --checkpoint_start=restore_other_model, or start over "
          "with --checkpoint_start=fresh"));
    }
  }
  if (absl::Status s = shard_->Restore(*checkpoint); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot restore the checkpoint in ", from, " (",
                                               Describe(*checkpoint), "): ", s.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    last_version_ = checkpoint->version();
    last_finished_ = checkpoint->finished();
    stats_.set_version(checkpoint->version());
    stats_.set_restored_version(checkpoint->version());
    PublishStats();
  }
  const bool adopted = start == CheckpointStart::kRestore &&
                       (checkpoint->run_id() != identity_.run_id ||
                        checkpoint->config_hash() != identity_.config_hash || checkpoint->finished());
  if (adopted) {
    spdlog::warn("{} restores {} from {} as asked (--checkpoint_start={})", task_,
                 Describe(*checkpoint), from,
                 other_model_allowed ? "restore_other_model" : "restore");
  }
  // Stamped with this run, so that a restart of this run finds its own;
  // and written here, so that this folder holds the shard's newest
  // whatever becomes of the backup's (another run moves it aside).
  if (adopted || from != dir_) {
    absl::StatusOr<Written> stamped = Write(shard_->Snapshot());
    if (!stamped.ok()) return stamped.status();
  }
  return checkpoint->version();
}

absl::StatusOr<Checkpointer::Written> Checkpointer::CheckpointNow() {
  // Done only goes from false to true: when every worker is done before the
  // snapshot, the snapshot is the final state.
  const bool finished = shard_->holds_final_state();
  ShardCheckpoint checkpoint = shard_->CheckpointSnapshot();
  checkpoint.set_finished(finished);
  return Write(std::move(checkpoint));
}

void Checkpointer::PublishStats() { shard_->SetCheckpointStats(stats_); }

bool Checkpointer::CountFailure(const absl::Status& status) {
  stats_.set_failures(stats_.failures() + 1);
  stats_.set_consecutive_failures(stats_.consecutive_failures() + 1);
  stats_.set_last_error(std::string(status.message()));
  PublishStats();
  const int max_failures = config_.max_failures() > 0 ? config_.max_failures() : kDefaultMaxFailures;
  spdlog::error("{}: checkpoint failed ({} in a row; the PS stops at {}): {}", task_,
                stats_.consecutive_failures(), max_failures, std::string(status.message()));
  if (stats_.consecutive_failures() < max_failures || gave_up_) return gave_up_;
  gave_up_ = true;
  return true;
}

absl::StatusOr<Checkpointer::Written> Checkpointer::Write(ShardCheckpoint checkpoint) {
  checkpoint.set_run_id(identity_.run_id);
  checkpoint.set_config_hash(identity_.config_hash);
  absl::Status give_up;
  absl::StatusOr<std::string> path;
  {
    absl::MutexLock lock(&mu_);
    if (checkpoint.variables_size() == 0) {
      return absl::FailedPreconditionError("nothing to checkpoint: the shard is not initialized");
    }
    if (gave_up_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoints are off: the writer gave up after ", stats_.consecutive_failures(),
          " failures in a row (", stats_.last_error(), ")"));
    }
    path = checkpoint.incomplete().empty()
               ? writer_(dir_, checkpoint, config_.keep() > 0 ? config_.keep() : kDefaultKeep)
               : absl::StatusOr<std::string>(absl::InternalError(absl::StrCat(
                     "the snapshot misses part of the shard: ", checkpoint.incomplete())));
    if (path.ok()) {
      last_version_ = checkpoint.version();
      last_finished_ = checkpoint.finished();
      stats_.set_written(stats_.written() + 1);
      stats_.set_consecutive_failures(0);
      stats_.clear_last_error();
      stats_.set_version(checkpoint.version());
      PublishStats();
    } else {
      // This link of the chain is lost (unless a retry writes it): the
      // next one starts a chain, since a delta over it would not restore.
      shard_->RestartCheckpointChain();
      if (CountFailure(path.status())) {
        give_up = absl::UnavailableError(absl::StrCat(
            "checkpoint at version ", checkpoint.version(), " in ", dir_, " failed ",
            stats_.consecutive_failures(), " times in a row (", path.status().message(),
            "); stopping rather than training on with nothing recent on disk"));
      }
    }
  }
  if (!give_up.ok()) {
    if (on_give_up_) on_give_up_(give_up);
    return give_up;
  }
  if (!path.ok()) return path.status();
  spdlog::info("checkpoint at version {}: {}", checkpoint.version(), *path);
  return Written{*path, checkpoint.version()};
}

void Checkpointer::WriteScheduled(ShardCheckpoint snapshot) {
  absl::Duration retry = kFirstRetry;
  while (true) {
    absl::StatusOr<Written> written = Write(snapshot);
    if (written.ok()) break;
    {
      absl::MutexLock lock(&mu_);
      if (gave_up_) return;  // pushes stay held: no version past this one is ever unsaved
    }
    // Pushes stay held while we retry, so the bound on what a crash loses holds.
    if (stop_.WaitForNotificationWithTimeout(retry)) return;
    retry = std::min(retry * 2, kLongestRetry);
  }
  shard_->ScheduledSnapshotWritten();
}

void Checkpointer::Start() {
  if (config_.dir().empty() || (config_.every_steps() <= 0 && config_.every_seconds() <= 0)) return;
  if (config_.every_steps() > 0) shard_->AttachCheckpointWriter();
  thread_ = std::thread([this] { Loop(); });
}

void Checkpointer::Loop() {
  absl::Time last_time = absl::Now();
  while (!stop_.HasBeenNotified()) {
    {
      absl::MutexLock lock(&mu_);
      if (gave_up_) return;
    }
    // Step-driven checkpoints: the shard copies its state exactly when the
    // version reaches a multiple of every_steps; we only write it out.
    if (std::optional<ShardCheckpoint> snapshot =
            shard_->TakeScheduledSnapshot(absl::Now() + kPollInterval)) {
      WriteScheduled(*std::move(snapshot));
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
      CheckpointNow().IgnoreError();  // counted and logged; the next period tries again
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
  int64_t last_version;
  bool last_finished;
  {
    absl::MutexLock lock(&mu_);
    if (gave_up_) return;
    last_version = last_version_;
    last_finished = last_finished_;
  }
  // Also when only the workers finished since: the final file says so.
  if (shard_->version() != last_version || (!last_finished && shard_->holds_final_state())) {
    CheckpointNow().IgnoreError();
  }
}

}  // namespace pst
