// The shard's side of a push applied while it streams in
// (ps_server/core/streamed_update.h): its admission, the staging it holds while
// the stream lasts, the wait of the other updates for their turn, the
// cancellation of a stalled stream, and the commit.
#include <memory>
#include <vector>

#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_requests.h"
#include "ps_server/core/streamed_update.h"

namespace pst {

absl::StatusOr<ParameterShard::StreamedPush> ParameterShard::BeginStreamedPush(
    const PushRequest& header) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWorker(header.worker()); !s.ok()) return Refuse(s);
  if (absl::Status s = CheckPrimary(); !s.ok()) return Refuse(s);
  if (!tables_.initialized()) return Refuse(PushBeforeInit());
  if (absl::Status s = CheckClaims(header); !s.ok()) {
    return Refuse(s);
  }
  if (header.has_rates()) {
    if (absl::Status s = tables_.CheckRates(header.rates()); !s.ok()) return Refuse(s);
  }
  StreamedPush push;
  std::vector<int> indices;
  DenseTable& dense = tables_.dense();
  if (absl::Status s = dense.CheckStreamHeader(header, policy_->PushCarriesEveryVariable(),
                                               &indices, &push.bytes);
      !s.ok()) {
    return Refuse(s);
  }
  // Read like any push (its sizes are known), and answered by Push, which
  // applies nothing of a repeat.
  if (RepeatedPush(header)) return push;
  absl::StatusOr<Admission> admission =
      policy_->AdmitPush(View(), header.worker(), header.computed_at_version());
  // Rows are applied by Push only, with the dense part of their push.
  const bool has_rows = !header.rows().empty();
  // A SYNC step of one gradient averages that gradient alone: it is
  // applied as it streams in, in one pass, as a push the policy applies on
  // its own would be.
  const bool whole_step = admission.ok() && admission->action == Admission::Action::kAggregate &&
                          !has_rows && landing_ == 0 &&
                          policy_->CompletesStepAlone(View(), header.worker());
  const bool applies = admission.ok() && admission->action == Admission::Action::kApply;
  // A clipped update needs its whole gradient's norm before it applies any.
  const UpdateRates* rates = header.has_rates() ? &header.rates() : nullptr;
  const bool clipped = ClipNorm(rates, options_.optimizer.clip_norm()) > 0.0f;
  if (has_rows || clipped || !(applies || whole_step) || !UpdateMayStage() || shutting_down_) {
    push.awaits_turn = !has_rows && !clipped && (applies || whole_step) && !shutting_down_;
    return push;  // Push decides, once the gradient is in
  }
  push.update.reset(new StreamedUpdate(this, &dense.threads(), dense.parts()));
  StreamedUpdate& update = *push.update;
  update.worker_ = header.worker();
  update.computed_at_ = header.computed_at_version();
  update.staleness_ = version_ - header.computed_at_version();
  update.whole_step_ = whole_step;
  update.indices_ = std::move(indices);
  if (absl::Status s =
          update.Stage(dense.store(), UpdateSettings(admission->lr_scale, rates));
      !s.ok()) {
    return Refuse(s);
  }
  staging_.Hold(push.update.get());
  Touch(header.worker());
  return push;
}

ParameterShard::WaitId ParameterShard::AwaitUpdateTurnOrWait(absl::AnyInvocable<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (UpdateMayStage()) return 0;
  // Held by a snapshot or by backups behind, updates wait to be woken
  // (Changed); held by a stream, they also check that it still moves.
  const absl::Duration recheck =
      staging_.held() && !snapshots_.holds_updates()
          ? staging_.CancelIfStalled(options_.stalled_stream_timeout, options_.shard)
          : absl::InfiniteDuration();
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
  absl::Status finished = update->Finish(tables_.dense().store());
  if (update->whole_step_) {
    // As an aggregated step: the workers wait for the next version whatever
    // happens, so an update that would make the model non-finite skips it.
    ledger_.RecordPush(update->worker_, update->computed_at_, update->staleness_);
    response->set_outcome(CompleteStep(finished));
    response->set_version(version_);
    return absl::OkStatus();
  }
  if (!finished.ok()) {
    tables_.Discard();
    return Refuse(finished);
  }
  ledger_.RecordPush(update->worker_, update->computed_at_, update->staleness_);
  CommitApplied(update->worker_, response);
  return absl::OkStatus();
}

bool ParameterShard::AnswerMayStreamDuringPush(const StreamedUpdate& update,
                                               int64_t min_version) const {
  // A replicated shard answers only with what its backups hold.
  if (options_.replicas > 1) return false;
  // The step's result is this push: committed, it is the next version.
  if (update.whole_step_) return min_version <= update.computed_at_ + 1;
  return policy_->AnswerMayStreamDuringPush(min_version, update.computed_at_);
}

void ParameterShard::ReleaseStaging() {
  absl::MutexLock lock(&mu_);
  ReleaseStagingLocked();
}

void ParameterShard::ReleaseStagingLocked() {
  staging_.Release();
  Changed();  // updates wait for it
}

void ParameterShard::CountRejectedPush() {
  absl::MutexLock lock(&mu_);
  ++pushes_.rejected;
}

}  // namespace pst
