// ParameterShard's replicas (parameter_shard.h, "Replicas"): the primary's
// log of updates for its backups and the commit rule, and a backup's side.
#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/transient_refusal.h"
#include "ps_server/core/parameter_shard.h"
#include "spdlog/spdlog.h"

namespace pst {

bool ParameterShard::primary() const {
  absl::MutexLock lock(&mu_);
  return primary_;
}

int64_t ParameterShard::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

absl::Status ParameterShard::CheckPrimary() const {
  if (primary_) return absl::OkStatus();
  // Marked, so a worker looks for the primary among the shard's replicas.
  return MarkTransient(
      absl::FailedPreconditionError(absl::StrCat(
          "this process is a backup of shard ", options_.shard, " (replica ", options_.replica,
          ", epoch ", epoch_, "); send updates to the shard's primary")),
      TransientRefusal::kNotPrimary);
}

bool ParameterShard::RepeatedPush(const PushRequest& request) const {
  return request.has_sequence() && request.sequence() < ledger_.clock(request.worker());
}

int64_t ParameterShard::ReplicatedLocked() const {
  if (!Forwards()) return version_;
  int64_t replicated = version_;
  for (int r = 0; r < static_cast<int>(backups_.size()); ++r) {
    if (r != options_.replica && CountsInCommitRule(backups_[r])) {
      replicated = std::min(replicated, backups_[r].acked);
    }
  }
  return replicated;
}

int64_t ParameterShard::replicated_version() const {
  absl::MutexLock lock(&mu_);
  return ReplicatedLocked();
}

bool ParameterShard::Replicated(int worker, int64_t min_version) const {
  if (!Forwards()) return true;
  if (first_chain_pending_) return false;
  // What the pull shows is at least min_version (the policy saw to it) and
  // at most version_; the worker's own push must be replicated before the
  // pull answers, since the answer acknowledges it.
  return ReplicatedLocked() >= std::max(std::min(min_version, version_), applied_for_[worker]);
}

absl::StatusOr<ParameterShard::WaitId> ParameterShard::AwaitPushReplicatedOrWait(
    int worker, absl::AnyInvocable<void()> wake) {
  PST_RETURN_IF_ERROR(CheckWorker(worker));
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  PST_RETURN_IF_ERROR(CheckPrimary());
  if (Replicated(worker, 0)) return WaitId{0};
  const auto answerable = [this, worker]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutting_down_ || !primary_ || Replicated(worker, 0);
  };
  return waiters_.Add(
      {.ready = answerable, .wake = std::move(wake), .worker = worker, .waiting = &waiting_pulls_});
}

absl::Status ParameterShard::BecomePrimary(int64_t epoch, Office office) {
  absl::MutexLock lock(&mu_);
  if (epoch <= epoch_ && !(primary_ && epoch == epoch_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, ": epoch ", epoch,
                     " is not above the newest this replica has seen, ", epoch_));
  }
  epoch_ = epoch;
  primary_ = true;
  replica_counts_.set_became_primary(replica_counts_.became_primary() + 1);
  // Workers' pushes before this office were acknowledged by another
  // primary, whose backups hold them.
  std::fill(applied_for_.begin(), applied_for_.end(), 0);
  // The workers called the predecessor, not this replica (which may have
  // dropped them from its live set meanwhile): each gets a whole lease
  // from now to find it, so a SYNC step does not complete without a worker
  // that is following the failover.
  ledger_.RenewAll();
  RestartForwarding(office);
  Changed();
  return absl::OkStatus();
}

void ParameterShard::StepDown() {
  absl::MutexLock lock(&mu_);
  if (!primary_) return;
  primary_ = false;
  spdlog::warn("shard {}: replica {} leaves office at epoch {}, version {}", options_.shard,
               options_.replica, epoch_, version_);
  Changed();  // waiting pulls and held updates are refused now
}

std::vector<int> ParameterShard::CaughtUpBackups() const {
  absl::MutexLock lock(&mu_);
  return CaughtUpBackupsLocked();
}

std::vector<int> ParameterShard::CaughtUpBackupsLocked() const {
  std::vector<int> backups;
  if (!primary_) return backups;
  for (int r = 0; r < static_cast<int>(backups_.size()); ++r) {
    const Backup& backup = backups_[r];
    if (r != options_.replica && InChain(backup)) backups.push_back(r);
  }
  return backups;
}

std::optional<std::vector<int>> ParameterShard::ChainToPublish() const {
  absl::MutexLock lock(&mu_);
  if (!primary_) return std::nullopt;
  if (first_chain_pending_) {
    for (int r = 0; r < static_cast<int>(backups_.size()); ++r) {
      if (r != options_.replica && CountsInCommitRule(backups_[r]) && !InChain(backups_[r])) {
        return std::nullopt;
      }
    }
  }
  return CaughtUpBackupsLocked();
}

void ParameterShard::ChainPublished(const std::vector<int>& backups) {
  absl::MutexLock lock(&mu_);
  published_chain_ = backups;
  if (first_chain_pending_) {
    first_chain_pending_ = false;
    Changed();  // pulls and pushes waiting for it are acknowledged
  }
}

bool ParameterShard::awaits_first_chain() const {
  absl::MutexLock lock(&mu_);
  return primary_ && first_chain_pending_;
}

bool ParameterShard::holds_state() const {
  absl::MutexLock lock(&mu_);
  return holds_state_;
}

bool ParameterShard::holds_final_state() const {
  absl::MutexLock lock(&mu_);
  if (options_.num_workers == 0 || !ledger_.AllDone()) return false;
  return std::all_of(done_told_at_.begin(), done_told_at_.end(),
                     [this](int64_t told_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return told_at == kNotToldDone || told_at <= version_;
                     });
}

void ParameterShard::RestartForwarding(std::optional<Office> new_office) {
  replica_log_.clear();
  log_bytes_ = 0;
  log_base_ = version_;
  if (new_office.has_value()) first_chain_pending_ = new_office == Office::kFirstOfJob;
  for (Backup& backup : backups_) {
    bool counts = backup.counts;
    if (new_office == Office::kFirstOfJob) counts = backup.live;
    if (new_office == Office::kAfterAChain) counts = false;
    backup = {.live = backup.live, .counts = counts, .holds_acknowledged_from = version_};
  }
  tables_.RecordChanges(/*record=*/options_.replicas > 1);
}

void ParameterShard::ForwardVersion() {
  auto update = std::make_shared<ReplicaUpdate>();
  update->set_epoch(epoch_);
  ShardCheckpoint* state = update->mutable_state();
  state->set_shard(options_.shard);
  state->set_version(version_);
  state->set_delta(true);
  state->set_parent_version(version_ - 1);
  state->set_base_version(log_base_);
  ledger_.ExportClocks(state);
  for (int worker : ledger_.DoneWorkers()) update->add_workers_done(worker);
  if (absl::Status s = tables_.ExportChanges(update.get()); !s.ok()) {
    // The changes are lost to the log: every backup takes the state whole.
    spdlog::error(
        "shard {}: version {} cannot be forwarded to the backups ({}); they are sent "
        "the state whole",
        options_.shard, version_, std::string(s.message()));
    RestartForwarding();
    return;
  }
  replica_counts_.set_updates_forwarded(replica_counts_.updates_forwarded() + 1);
  const auto bytes = static_cast<int64_t>(update->ByteSizeLong());
  replica_counts_.set_bytes_forwarded(replica_counts_.bytes_forwarded() + bytes);
  log_bytes_ += bytes;
  replica_log_.push_back(std::move(update));
}

void ParameterShard::FillReplicationStats(ReplicationStats* stats) const {
  *stats = replica_counts_;
  stats->set_replica(options_.replica);
  stats->set_replicas(options_.replicas);
  stats->set_primary(primary_);
  stats->set_epoch(epoch_);
  if (!primary_) return;
  stats->set_replicated_version(ReplicatedLocked());
  for (int r = 0; r < static_cast<int>(backups_.size()); ++r) {
    if (r == options_.replica) continue;
    const Backup& backup = backups_[r];
    ReplicationStats::Backup* out = stats->add_backups();
    out->set_replica(r);
    out->set_live(backup.live);
    out->set_in_commit_rule(CountsInCommitRule(backup));
    out->set_acked_version(backup.acked);
    // A job's first office has published nothing yet: no backup may take over.
    out->set_in_chain(published_chain_.has_value()
                          ? std::find(published_chain_->begin(), published_chain_->end(), r) !=
                                published_chain_->end()
                          : !first_chain_pending_ && InChain(backup));
    out->set_lag_versions(version_ - std::max<int64_t>(backup.acked, 0));
    int64_t bytes = 0;
    for (const auto& logged : replica_log_) {
      if (logged->state().version() > backup.acked) {
        bytes += static_cast<int64_t>(logged->ByteSizeLong());
      }
    }
    out->set_lag_bytes(bytes);
  }
}

void ParameterShard::TrimReplicaLog() {
  const int64_t max_catch_up_bytes = std::max(kMinCatchUpLogBytes, 2 * whole_bytes_);
  int64_t held = version_;
  for (int r = 0; r < static_cast<int>(backups_.size()); ++r) {
    Backup& backup = backups_[r];
    if (r == options_.replica || !backup.live) continue;
    if (CountsInCommitRule(backup)) {
      held = std::min(held, backup.acked);
      continue;
    }
    // Catching up: the log keeps what follows what it holds, or the state
    // on its way to it, unless a newer state whole is cheaper.
    const int64_t needs = backup.acked >= 0 ? backup.acked : backup.sent;
    if (needs < 0) continue;  // it is sent the state whole next
    if (needs <= log_base_ && log_bytes_ > max_catch_up_bytes) {
      backup.sent = -1;
      backup.acked = -1;
      continue;
    }
    held = std::min(held, needs);
  }
  while (!replica_log_.empty() && replica_log_.front()->state().version() <= held) {
    log_base_ = replica_log_.front()->state().version();
    log_bytes_ -= static_cast<int64_t>(replica_log_.front()->ByteSizeLong());
    replica_log_.pop_front();
  }
}

void ParameterShard::MaybeJoin(Backup& backup) {
  if (!backup.live || backup.counts || backup.acked < 0) return;
  if (version_ - backup.acked >= kMaxUnreplicated) return;
  backup.counts = true;
  // What was acknowledged before, up to version_, it must hold too before
  // it may take over.
  backup.holds_acknowledged_from = version_;
}

absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>>
ParameterShard::TakeReplicaUpdates(int replica, absl::Time deadline) {
  if (replica < 0 || replica >= options_.replicas || replica == options_.replica) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " has no backup ", replica));
  }
  std::vector<std::shared_ptr<const ReplicaUpdate>> updates;
  std::optional<ShardSnapshot> whole;
  int64_t whole_epoch = 0;
  std::vector<int> whole_done;
  {
    absl::MutexLock lock(&mu_);
    Backup& backup = backups_[replica];
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || !primary_ || (tables_.initialized() && backup.sent < version_);
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
    PST_RETURN_IF_ERROR(CheckPrimary());
    if (!ready()) return updates;
    if (backup.sent < log_base_) {
      whole = SnapshotLocked();
      whole_epoch = epoch_;
      whole_done = ledger_.DoneWorkers();
    } else {
      for (const auto& logged : replica_log_) {
        if (logged->state().version() > backup.sent) updates.push_back(logged);
      }
    }
    backup.sent = version_;
  }
  // The state whole is written outside the lock, from the tables' views.
  if (whole) {
    auto update = std::make_shared<ReplicaUpdate>();
    update->set_epoch(whole_epoch);
    *update->mutable_state() = std::move(*whole).Finish();
    for (int worker : whole_done) update->add_workers_done(worker);
    const auto bytes = static_cast<int64_t>(update->ByteSizeLong());
    {
      absl::MutexLock lock(&mu_);
      whole_bytes_ = bytes;
    }
    updates.push_back(std::move(update));
  }
  return updates;
}

void ParameterShard::ReplicaAcked(int replica, int64_t version) {
  absl::MutexLock lock(&mu_);
  if (replica < 0 || replica >= static_cast<int>(backups_.size())) return;
  Backup& backup = backups_[replica];
  backup.acked = std::max(backup.acked, std::min(version, backup.sent));
  MaybeJoin(backup);
  TrimReplicaLog();
  Changed();
}

void ParameterShard::ReplicaResync(int replica, int64_t version) {
  absl::MutexLock lock(&mu_);
  if (replica < 0 || replica >= static_cast<int>(backups_.size())) return;
  Backup& backup = backups_[replica];
  // A version the log no longer reaches, or one this office never sent,
  // takes the state whole.
  const bool follows = version >= log_base_ && version <= backup.sent;
  backup.sent = follows ? version : -1;
  backup.acked = follows ? std::max(backup.acked, version) : -1;
  MaybeJoin(backup);
  TrimReplicaLog();
  Changed();
}

void ParameterShard::SetReplicaLive(int replica, bool live) {
  absl::MutexLock lock(&mu_);
  if (replica < 0 || replica >= static_cast<int>(backups_.size())) return;
  Backup& backup = backups_[replica];
  if (backup.live == live) return;
  backup = {.live = live, .counts = false};
  TrimReplicaLog();
  Changed();  // pulls and updates may wait on it no more
}

void ParameterShard::AnswerReplica(ReplicaAck* ack) const {
  ack->set_version(holds_state_ ? version_ : -1);
  ack->set_epoch(epoch_);
}

absl::Status ParameterShard::ApplyReplicaUpdate(const ReplicaUpdate& update, ReplicaAck* ack) {
  return ApplyReplicaUpdate(update, ack, [] {});
}

absl::Status ParameterShard::ApplyReplicaUpdate(const ReplicaUpdate& update, ReplicaAck* ack,
                                                absl::FunctionRef<void()> acknowledge) {
  absl::MutexLock lock(&mu_);
  AnswerReplica(ack);
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (update.epoch() < epoch_ || (primary_ && update.epoch() == epoch_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard, " replica ", options_.replica, " refuses an update of epoch ",
        update.epoch(), ": it has seen epoch ", epoch_, primary_ ? " as primary" : ""));
  }
  const ShardCheckpoint& state = update.state();
  if (state.version() < 0 || (state.delta() && state.version() <= state.parent_version())) {
    return absl::InvalidArgumentError(absl::StrCat("an update to version ", state.version(),
                                                   " over version ", state.parent_version()));
  }
  for (int worker : update.workers_done()) {
    if (worker < 0 || worker >= options_.num_workers) {
      return absl::InvalidArgumentError(absl::StrCat("an update names worker ", worker,
                                                     " done; the job has ", options_.num_workers,
                                                     " worker(s)"));
    }
  }
  if (primary_ && (landing_ > 0 || staging_.held())) {
    // Pushes land outside the lock: the state is not replaced under them.
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " replica ", options_.replica,
                     " is primary with an update under way; send the state again"));
  }
  bool acknowledged = false;
  if (state.delta()) {
    if (!holds_state_ || state.parent_version() != version_) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", options_.shard, " replica ", options_.replica, " holds ",
                       holds_state_ ? absl::StrCat("version ", version_) : std::string("no state"),
                       ", not version ", state.parent_version(), " that the update follows"));
    }
    const auto checked = [&] {
      ack->set_version(state.version());
      ack->set_epoch(update.epoch());
      ack->set_applied(true);
      acknowledged = true;
      acknowledge();
    };
    if (absl::Status s = tables_.ApplyChanges(update, checked); !s.ok()) {
      // Refused before its acknowledgement, an update changed nothing.
      if (acknowledged || s.code() != absl::StatusCode::kInvalidArgument) holds_state_ = false;
      if (!acknowledged) AnswerReplica(ack);
      return s;
    }
  } else {
    // The state whole, replacing whatever the tables held.
    if (absl::Status s = tables_.Restore(state); !s.ok()) {
      holds_state_ = false;
      AnswerReplica(ack);
      return s;
    }
    reads_ahead_.store(tables_.embeddings().ReadsAhead());
    chain_ = CheckpointChain();  // the tables tracked nothing: a full link first
  }
  // Only an update applied changes what this replica knows of the epochs.
  if (primary_) {
    spdlog::warn(
        "shard {}: replica {} was primary at epoch {}; epoch {} has another, so it is "
        "now a backup",
        options_.shard, options_.replica, epoch_, update.epoch());
    primary_ = false;
  }
  epoch_ = update.epoch();
  holds_state_ = true;
  replica_counts_.set_updates_applied(replica_counts_.updates_applied() + 1);
  if (!state.delta()) replica_counts_.set_states_applied(replica_counts_.states_applied() + 1);
  replica_counts_.set_bytes_applied(replica_counts_.bytes_applied() +
                                    static_cast<int64_t>(update.ByteSizeLong()));
  version_ = state.version();
  ledger_.RestoreClocks(state);
  // The primary's, and the Dones this replica was told directly that the
  // update, captured before them, cannot know of. A newer update that does
  // not name such a worker says it registered again there.
  std::vector<int> done(update.workers_done().begin(), update.workers_done().end());
  std::vector<bool> named(done_told_at_.size(), false);
  for (int worker : done) named[worker] = true;
  for (size_t worker = 0; worker < done_told_at_.size(); ++worker) {
    int64_t& told_at = done_told_at_[worker];
    if (told_at == kNotToldDone) continue;
    if (named[worker] || told_at < state.version()) {
      told_at = kNotToldDone;
    } else {
      done.push_back(static_cast<int>(worker));
    }
  }
  ledger_.SetDoneWorkers(done);
  AnswerReplica(ack);
  ack->set_applied(true);
  if (!acknowledged) acknowledge();
  Changed();
  return absl::OkStatus();
}

}  // namespace pst
