#include "ps_server/service/replica_sender.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "ps_server/service/replica_pieces.h"
#include "spdlog/spdlog.h"

namespace pst {

ReplicaSender::ReplicaSender(ParameterShard* shard,
                             std::unique_ptr<ParameterServer::StubInterface> stub, Options options)
    : shard_(shard), stub_(std::move(stub)), options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

ReplicaSender::~ReplicaSender() {
  stop_.Notify();
  thread_.join();
}

void ReplicaSender::Run() {
  // The wait for updates is cut short, so that a stop is seen soon.
  constexpr absl::Duration kPoll = absl::Milliseconds(100);
  while (!stop_.HasBeenNotified()) {
    // A backup out of the commit rule is asked whether it answers before
    // anything is taken for it: the updates taken while it was away are
    // not offered again, so a shard with nothing new to forward (between
    // runs, or at the end of one) would never try it again, and a backup
    // that came up meanwhile would stay out of the chain for good. Once it
    // answers, it is offered the state whole; the answer to that (Send)
    // brings it back in. A backup not up yet at the start is asked the
    // same way, in the commit rule, until its patience runs out.
    if (awaiting_start_ || (!live_ && !drop_pending_)) {
      if (!Answers()) {
        if (awaiting_start_ && !WaitsForStart()) {
          awaiting_start_ = false;
          GoOnWithout(absl::StrCat("did not come up within ",
                                   absl::FormatDuration(options_.start_patience)));
        }
        stop_.WaitForNotificationWithTimeout(options_.retry);
        continue;
      }
      if (awaiting_start_) {
        spdlog::info("shard {}: backup {} at {} is up; it is sent the state whole", shard_->shard(),
                     options_.replica, options_.address);
        awaiting_start_ = false;
      }
      shard_->ReplicaResync(options_.replica, -1);
    }
    absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> updates =
        shard_->TakeReplicaUpdates(options_.replica, absl::Now() + kPoll);
    if (!updates.ok()) {
      if (updates.status().code() == absl::StatusCode::kUnavailable) return;  // shutting down
      // Not primary (any more): nothing to forward until this process is again.
      stop_.WaitForNotificationWithTimeout(options_.retry);
      continue;
    }
    for (const auto& update : *updates) {
      if (stop_.HasBeenNotified() || !Send(*update)) break;
    }
  }
}

bool ReplicaSender::Answers() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  StatsResponse stats;
  if (!stub_->Stats(&context, StatsRequest(), &stats).ok()) return false;
  answered_ = true;
  return true;
}

bool ReplicaSender::WaitsForStart() const {
  return shard_->awaits_first_chain() && absl::Now() - started_ < options_.start_patience;
}

void ReplicaSender::GoOnWithout(const std::string& failed) {
  if (!live_) return;
  if (!drop_pending_) {
    spdlog::warn(
        "shard {}: backup {} at {} {}; the shard goes on without it until it answers again",
        shard_->shard(), options_.replica, options_.address, failed);
  }
  absl::Status dropped = absl::OkStatus();
  if (options_.drop) {
    dropped = options_.drop(options_.replica);
  } else {
    shard_->SetReplicaLive(options_.replica, false);
  }
  // Not dropped (the office could not publish the chain without it): it
  // stays in the commit rule, and the next failed call tries again.
  drop_pending_ = !dropped.ok();
  live_ = drop_pending_;
}

bool ReplicaSender::Send(const ReplicaUpdate& update) {
  const int64_t version = update.state().version();
  const auto bytes = static_cast<int64_t>(update.ByteSizeLong());
  if (options_.max_message_bytes <= 0 || bytes <= options_.max_message_bytes) {
    return SendMessage(update, version, /*last=*/true, bytes);
  }
  absl::StatusOr<ReplicaPieces> pieces = ReplicaPieces::Of(update, options_.max_message_bytes);
  if (!pieces.ok()) {
    // Dense variables past what a backup can parse (2 GiB): tried again
    // seldom, since each try captures the state whole.
    constexpr absl::Duration kTooLargeRetry = absl::Seconds(30);
    spdlog::error("shard {}: version {} cannot be sent to backup {} at {}: {}; tried again in {} s",
                  shard_->shard(), version, options_.replica, options_.address,
                  std::string(pieces.status().message()), absl::ToInt64Seconds(kTooLargeRetry));
    stop_.WaitForNotificationWithTimeout(kTooLargeRetry);
    return false;
  }
  for (size_t i = 0; i < pieces->size(); ++i) {
    const bool last = i + 1 == pieces->size();
    const ReplicaUpdate piece = pieces->Piece(i);
    const auto piece_bytes = static_cast<int64_t>(piece.piece().bytes().size());
    if (!SendMessage(piece, version, last, last ? bytes : piece_bytes)) return false;
  }
  return true;
}

bool ReplicaSender::SendMessage(const ReplicaUpdate& message, int64_t version, bool last,
                                int64_t apply_bytes) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + options_.timeout +
      absl::Seconds(static_cast<double>(apply_bytes) / options_.bytes_per_second)));
  ReplicaAck ack;
  const grpc::Status status = stub_->Replicate(&context, message, &ack);
  const int shard = shard_->shard();
  if (!status.ok()) {
    if (live_ && !answered_ && WaitsForStart()) {
      if (!awaiting_start_) {
        spdlog::info(
            "shard {}: backup {} at {} does not answer yet ({}: {}); updates wait for it "
            "to come up, for up to {}",
            shard, options_.replica, options_.address, static_cast<int>(status.error_code()),
            status.error_message(), absl::FormatDuration(options_.start_patience));
      }
      awaiting_start_ = true;
    } else {
      GoOnWithout(absl::StrCat("did not take version ", version, " (",
                               static_cast<int>(status.error_code()), ": ", status.error_message(),
                               ")"));
    }
    stop_.WaitForNotificationWithTimeout(options_.retry);
    return false;
  }
  answered_ = true;
  // A piece taken: the next follows (the update's answer comes with its
  // last piece).
  if (!last && live_ && ack.applied()) return true;
  if (!live_) {
    spdlog::info(
        "shard {}: backup {} at {} answers again (at version {}); it is sent the state "
        "whole",
        shard, options_.replica, options_.address, ack.version());
    shard_->SetReplicaLive(options_.replica, true);
    live_ = true;
    return false;
  }
  if (ack.applied()) {
    deposed_ = false;
    shard_->ReplicaAcked(options_.replica, ack.version());
    return true;
  }
  if (ack.epoch() > message.epoch()) {
    if (!deposed_) {
      spdlog::error(
          "shard {}: backup {} at {} has seen epoch {}, newer than this primary's {}: "
          "another replica is primary, so this one steps down",
          shard, options_.replica, options_.address, ack.epoch(), message.epoch());
      deposed_ = true;
    }
    // It could acknowledge nothing more: its workers are sent on to look
    // for the new primary rather than wait.
    shard_->StepDown();
    stop_.WaitForNotificationWithTimeout(options_.retry);
    return false;
  }
  shard_->ReplicaResync(options_.replica, ack.version());
  return false;
}

}  // namespace pst
