// The shard's side of a push applied while it streams in
// (ps_server/streamed_update.h): its admission, the staging it holds while
// the stream lasts, the wait of the other updates for their turn, the
// cancellation of a stalled stream, and the commit.
#include <algorithm>
#include <memory>

#include "ps_server/parameter_shard.h"
#include "ps_server/shard_requests.h"
#include "ps_server/streamed_update.h"
#include "spdlog/spdlog.h"

namespace pst {

absl::StatusOr<ParameterShard::StreamedPush> ParameterShard::BeginStreamedPush(
    const PushRequest& header) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWorker(header.worker()); !s.ok()) return Refuse(s);
  if (!Initialized()) return Refuse(PushBeforeInit());
  if (absl::Status s = CheckPushClaims(header, options_.shard, version_); !s.ok()) {
    return Refuse(s);
  }
  StreamedPush push;
  std::vector<int> indices;
  if (absl::Status s = dense_->CheckStreamHeader(header, &indices, &push.bytes); !s.ok()) {
    return Refuse(s);
  }
  absl::StatusOr<Admission> admission =
      policy_->AdmitPush(View(), header.worker(), header.computed_at_version());
  // Rows are applied by Push only, with the dense part of their push.
  const bool has_rows = !header.rows().empty();
  if (has_rows || !admission.ok() || admission->action != Admission::Action::kApply ||
      staging_held_ || snapshots_.holds_updates() || shutting_down_) {
    push.awaits_turn = !has_rows && admission.ok() &&
                       admission->action == Admission::Action::kApply && !shutting_down_;
    return push;  // Push decides, once the gradient is in
  }
  push.update.reset(new StreamedUpdate(this, &dense_->threads(), dense_->parts()));
  StreamedUpdate& update = *push.update;
  update.worker_ = header.worker();
  update.computed_at_ = header.computed_at_version();
  update.staleness_ = version_ - header.computed_at_version();
  update.indices_ = std::move(indices);
  if (absl::Status s = update.Stage(dense_->store(), admission->lr_scale); !s.ok()) {
    return Refuse(s);
  }
  staging_held_ = true;
  staging_holder_ = push.update.get();
  Touch(header.worker());
  return push;
}

absl::Duration ParameterShard::CancelStalledStream() {
  StreamedUpdate* holder = staging_holder_;
  const absl::Duration idle = holder->Idle();
  if (idle < options_.stalled_stream_timeout || holder->cancelled_) {
    return std::max(options_.stalled_stream_timeout - idle, absl::Milliseconds(10));
  }
  spdlog::warn("shard {}: worker:{}'s push stream sent nothing for {}; cancelling it so that "
               "other updates can go on",
               options_.shard, holder->worker_, absl::FormatDuration(idle));
  holder->cancelled_ = true;
  if (holder->cancel_) {
    holder->cancel_();  // the stream's next read fails and drops the update
  }
  return absl::Milliseconds(10);
}

ParameterShard::WaitId ParameterShard::AwaitUpdateTurnOrWait(absl::AnyInvocable<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (UpdateMayStage()) return 0;
  const absl::Duration recheck =
      snapshots_.holds_updates() ? absl::InfiniteDuration() : CancelStalledStream();
  return waiters_.Add(
      {.ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return UpdateMayStage(); },
       .deadline = absl::Now() + recheck,
       .wake = std::move(wake),
       .waiting = &waiting_updates_});
}

absl::Status ParameterShard::CommitStreamedPush(std::unique_ptr<StreamedUpdate> update,
                                                PushResponse* response) {
  absl::MutexLock lock(&mu_);
  // Whatever happens, the staging is free when this returns.
  update->holds_staging_ = false;
  update->staged_.clear();
  ReleaseStagingLocked();
  if (shutting_down_) return absl::UnavailableError("the parameter server is shutting down");
  if (update->cancelled_) {
    return Refuse(absl::AbortedError(
        "the push stream stalled while other updates waited and was cancelled; nothing of it "
        "was applied"));
  }
  Touch(update->worker_);
  if (absl::Status s = update->Finish(dense_->store()); !s.ok()) {
    DiscardTables();
    return Refuse(s);
  }
  ledger_.RecordPush(update->worker_, update->computed_at_, update->staleness_);
  CommitApplied(response);
  return absl::OkStatus();
}

void ParameterShard::ReleaseStaging() {
  absl::MutexLock lock(&mu_);
  ReleaseStagingLocked();
}

void ParameterShard::ReleaseStagingLocked() {
  staging_held_ = false;
  staging_holder_ = nullptr;
  Changed();  // updates wait for it
}

void ParameterShard::CountRejectedPush() {
  absl::MutexLock lock(&mu_);
  ++pushes_rejected_;
}

}  // namespace pst
