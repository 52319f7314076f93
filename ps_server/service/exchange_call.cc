#include "ps_server/service/exchange_call.h"

#include <algorithm>
#include <optional>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "ps_server/core/pull_reply.h"
#include "ps_server/service/exchange_path.h"
#include "ps_server/service/exchange_phase.h"
#include "ps_server/service/exchange_rpc.h"
#include "ps_server/service/exchange_shm_path.h"
#include "ps_server/service/exchange_tcp_path.h"
#include "ps_server/service/ps_metrics.h"
#include "ps_server/service/shm_exchange.h"
#include "rpc/grpc_credentials.h"
#include "rpc/worker_session.h"

namespace pst {
namespace {

// Bytes of ids and data in `rows`.
int64_t RowBytes(const google::protobuf::RepeatedPtrField<EmbeddingRows>& rows) {
  int64_t bytes = 0;
  for (const EmbeddingRows& r : rows) {
    bytes += static_cast<int64_t>(r.ids().size() + r.data().size());
  }
  return bytes;
}

// One exchange: the request read, the push applied and the pull answered,
// as the phases of exchange_phase.h; the gRPC side is ExchangeRpc's, the
// transport's part its path's (exchange_path.h). The request is touched by
// one event or pool task at a time.
class ExchangeCall final : public ExchangeRpc {
 public:
  ExchangeCall(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue)
      : ExchangeRpc(resources, queue) {}
  // Told last, once gRPC holds none of the call's messages either.
  ~ExchangeCall() override {
    if (large_rows_freed_ > 0) r_.large_rows_freed(large_rows_freed_);
  }

 private:
  using Phase = ExchangePhase;

  ExchangeRpc* Next() override { return new ExchangeCall(r_, completion_queue()); }
  void OnArrived() override;
  void OnRead(bool ok) override;
  void OnOver(const absl::Status& status) override;

  // The request's phase moves on; an illegal step aborts.
  void Enter(Phase next) {
    CheckTransition(phase_, next);
    phase_ = next;
  }

  absl::Status TakeMessage();
  // The first message: what the exchange asks, checked, and its path.
  absl::Status TakeHeader();
  absl::Status Refuse(absl::Status status);  // a malformed request, counted as a rejected push
  // Bounds the rows the pull names from the request's sizes, before any
  // is looked up and before the pull waits, and starts reading cold ones.
  absl::Status CheckRowsOfThePull();
  // Hands the claimed region to the path, and copies the rows that lie in
  // it into asks_, where a TCP exchange carries them, checking the room
  // for the rows it answers: all before anything is applied.
  absl::Status TakeRegion(ShmRegions::Claimed region);

  // Once the request is whole: the region claimed, the push applied, then
  // the pull, from the phase the call is in to the answer or to a wait. It
  // never blocks: where a step must wait (for the region, for the update's
  // turn, for the pull's version) it leaves a waiter and returns, and the
  // waiter's wake goes on.
  void Advance();
  // Claims the shared region: nullopt while the claim is parked
  // (RegionClaimed runs on the pool once the region is handed over), or
  // once the call has ended.
  std::optional<absl::Status> ClaimRegion();
  void RegionClaimed(absl::StatusOr<ShmRegions::Claimed> region);
  // Leaves a waiter for the update's turn (or, applied and answered alone,
  // for its replication); TurnWoken runs once woken.
  void AwaitTurn();
  void TurnWoken();
  void Pull();
  void PullWoken();
  void Answer(const std::shared_ptr<PullPayload>& payload);

  absl::Time start_;          // set as the call arrives
  absl::Time call_deadline_;  // the client's
  Phase phase_ = Phase::kReadingHeader;
  ReceivedChunk chunk_;
  ExchangeAsks asks_;  // set by TakeHeader
  // Bytes of large rows (kLargeRowBytes) the call freed, told as it goes.
  int64_t large_rows_freed_ = 0;
  std::unique_ptr<PushRequest> buffer_;
  std::variant<std::monostate, TcpPath, ShmPath> paths_;
  ExchangePath* path_ = nullptr;  // the one in paths_
  ShmPath* shm_ = nullptr;        // the same, if shared
  PushResponse push_response_;
  // The push is applied: a wake in kApplying goes on to its answer.
  bool push_applied_ = false;
  ExchangeTraffic traffic_;
  absl::Time pull_start_;
};

void ExchangeCall::OnArrived() {
  start_ = absl::Now();
  call_deadline_ = absl::FromChrono(context()->deadline());
  buffer_ = r_.take_push_buffer();
  Read();
}

void ExchangeCall::OnRead(bool ok) {
  if (!ok) {
    if (context()->IsCancelled()) {
      End(absl::CancelledError("the worker went away during the exchange"));
    } else if (phase_ == Phase::kReadingHeader) {
      // Not counted as a rejected push: there was none (and a request gRPC
      // refused as too large ends here too).
      End(absl::InvalidArgumentError("the exchange was empty: no header"));
    } else {
      Advance();
    }
    return;
  }
  if (absl::Status s = TakeMessage(); !s.ok()) {
    End(s);
    return;
  }
  // A request that is whole (a pull alone, a shared exchange, a push whose
  // every byte is in) is served at once, without waiting to read the end
  // of the request, which saves an event on the small exchange's path.
  // Nothing more is read: whatever a client sends after is not looked at.
  if (path_->RequestComplete()) {
    open_stream()->ReceivedAll();
    return Advance();
  }
  Read();
}

absl::Status ExchangeCall::Refuse(absl::Status status) {
  r_.shard->CountRejectedPush();
  return status;
}

absl::Status ExchangeCall::TakeMessage() {
  grpc::ByteBuffer* message = received();
  traffic_.in += static_cast<int64_t>(message->Length());
  open_stream()->Received(static_cast<int64_t>(message->Length()));
  if (absl::Status s = chunk_.Parse(message); !s.ok()) return Refuse(s);
  if (phase_ == Phase::kReadingHeader) {
    Enter(Phase::kReadingPush);
    PST_RETURN_IF_ERROR(TakeHeader());
  } else if (chunk_.has_header() || chunk_.has_extra() || chunk_.has_shm()) {
    return Refuse(absl::InvalidArgumentError("an exchange carries a second header"));
  }
  if (chunk_.pieces().empty()) return absl::OkStatus();
  return path_->TakePieces(chunk_, [this](grpc::ByteBuffer m) { Write(std::move(m)); });
}

absl::Status ExchangeCall::TakeHeader() {
  if (!chunk_.has_header()) {
    return Refuse(absl::InvalidArgumentError(
        "an exchange must start with its header (ExchangeChunk.header)"));
  }
  if (!chunk_.ParseHeader(&asks_.header)) {
    return Refuse(absl::InvalidArgumentError("an exchange's header is not a PushRequest"));
  }
  asks_.pushes = asks_.header.gradients_size() > 0 || asks_.header.rows_size() > 0;
  asks_.pulls_variables = asks_.header.gradients_size() > 0 || asks_.header.rows_size() == 0;
  asks_.pulls = chunk_.has_extra();
  if (asks_.pulls && !chunk_.ParseExtra(&asks_.pull)) {
    return Refuse(absl::InvalidArgumentError("an exchange's pull is not a PullRequest"));
  }
  asks_.shared = chunk_.has_shm();
  if (asks_.shared && !chunk_.ParseShm(&asks_.transfer)) {
    return Refuse(absl::InvalidArgumentError("an exchange's shm is not a ShmTransfer"));
  }
  if (!asks_.pushes && !asks_.pulls) {
    return absl::InvalidArgumentError(
        "an exchange with neither a push (gradients or rows in its header) nor a pull");
  }
  const int worker = asks_.header.worker();
  if (r_.task_tokens) {
    PST_RETURN_IF_ERROR(CheckActsAs(*context(), worker));
  }
  PST_RETURN_IF_ERROR(r_.sessions->Admit(worker, SessionOf(*context())));
  if (asks_.pulls) {
    asks_.pull.set_worker(worker);
    if (DTypeBytes(asks_.pull.dtype()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown wire dtype ", static_cast<int>(asks_.pull.dtype()), " in an exchange's pull"));
    }
    if (asks_.pushes) {
      AskForPushedVariables(asks_.header, &asks_.pull);
    } else if (absl::Status s = CheckPullNames(asks_.pull, *r_.limits); !s.ok()) {
      return s;
    }
    // Ids in a shared region are checked once they are read out of it.
    if (!RowsAnswerInRegion(asks_.transfer)) PST_RETURN_IF_ERROR(CheckRowsOfThePull());
  }
  const PathContext context{.asks = &asks_,
                            .shard = r_.shard,
                            .limits = r_.limits,
                            .stream = open_stream(),
                            .call = this->context(),
                            .payloads = r_.payloads,
                            .buffer = buffer_.get(),
                            .traffic = &traffic_};
  if (asks_.shared) {
    path_ = shm_ = &paths_.emplace<ShmPath>(context);
  } else {
    path_ = &paths_.emplace<TcpPath>(context);
  }
  return path_->Begin();
}

absl::Status ExchangeCall::CheckRowsOfThePull() {
  PST_RETURN_IF_ERROR(CheckPullRows(asks_.pull, *r_.limits));
  if (asks_.pull.rows_size() > 0) {
    const int64_t bytes = r_.shard->RowsAnswerBytes(asks_.pull);
    if (bytes > r_.limits->max_reply_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the rows this pull names take about ", bytes, " bytes, more than the ",
          r_.limits->max_reply_bytes,
          " bytes this PS encodes for one answer (--max_reply_bytes); pull fewer rows per "
          "call"));
    }
    r_.shard->PrefetchRows(asks_.pull);
  }
  return absl::OkStatus();
}

absl::Status ExchangeCall::TakeRegion(ShmRegions::Claimed region) {
  PST_RETURN_IF_ERROR(shm_->TakeRegion(std::move(region)));
  const ShmTransfer& transfer = asks_.transfer;
  if (transfer.push_rows().empty() && transfer.pull_rows().empty()) return absl::OkStatus();
  // A copy, checked by the shard as rows from a socket are: what the
  // worker writes into the region from now on changes nothing.
  absl::Status rows = ReadShmRows(transfer, shm_->region(), *r_.limits, &asks_.header,
                                  asks_.pulls ? &asks_.pull : nullptr);
  // Bytes that came through the region rather than in the message.
  if (rows.ok() && !transfer.push_rows().empty()) traffic_.in += RowBytes(asks_.header.rows());
  if (rows.ok() && !transfer.pull_rows().empty()) traffic_.in += RowBytes(asks_.pull.rows());
  if (rows.ok() && RowsAnswerInRegion(transfer)) {
    rows = CheckRowsOfThePull();
    if (!rows.ok()) return rows;  // as over TCP: a pull's refusal, not a push's
    rows = CheckShmRowsAnswer(transfer, r_.shard->RowsAnswerBytes(asks_.pull), shm_->region());
  }
  return rows.ok() || !asks_.pushes ? rows : Refuse(rows);
}

void ExchangeCall::Advance() {
  if (Ended()) return;
  while (true) {
    switch (phase_) {
      case Phase::kReadingPush:  // the request is whole
        Enter(shm_ != nullptr ? Phase::kClaimingRegion
              : asks_.pushes  ? Phase::kApplying
                              : Phase::kPulling);
        break;
      case Phase::kClaimingRegion: {
        std::optional<absl::Status> claimed = ClaimRegion();
        if (!claimed) return;  // parked: RegionClaimed goes on
        if (!claimed->ok()) return End(*claimed);
        Enter(asks_.pushes ? Phase::kApplying : Phase::kPulling);
        break;
      }
      case Phase::kApplying: {
        if (!push_applied_) {
          std::optional<absl::Status> applied = path_->ApplyPush(&push_response_);
          if (!applied) return AwaitTurn();  // its turn comes behind another update
          if (!applied->ok()) return End(*applied);
          push_applied_ = true;
        }
        // Answered alone, the push is acknowledged once the shard's backups
        // hold it; with a pull, the pull waits for that.
        if (!asks_.pulls) {
          absl::StatusOr<ParameterShard::WaitId> waited;
          const Parking parking = Park(Wait::kShard, [&]() -> uint64_t {
            waited = r_.shard->AwaitPushReplicatedOrWait(
                asks_.header.worker(), [this] { r_.work->Post([this] { TurnWoken(); }); });
            if (!waited.ok() || *waited == 0) return 0;
            Enter(Phase::kAwaitingTurn);
            return *waited;
          });
          if (parking != Parking::kNoWait) return;
          Unref();
          if (!waited.ok()) return End(waited.status());
        }
        // A repeat of a push the shard took before (the worker ran its step
        // again after an exchange that failed elsewhere) is answered with
        // what its first sending made: its read waits for no later version.
        if (push_response_.outcome() == PushResponse::DUPLICATE && asks_.pulls) {
          asks_.pull.set_min_version(std::min(asks_.pull.min_version(), push_response_.version()));
        }
        ExchangeDone done;
        *done.mutable_push() = push_response_;
        std::optional<grpc::ByteBuffer> answer = path_->AnswerOfThePush(&done);
        if (!answer) {
          Enter(Phase::kPulling);
          break;
        }
        Enter(Phase::kAnswered);
        Write(*std::move(answer));
        return End(absl::OkStatus());
      }
      case Phase::kPulling:
        pull_start_ = absl::Now();
        return Pull();
      default:  // a wait's wake enters the phase it goes on from, never Advance
        return CheckTransition(phase_, phase_);  // aborts: no phase follows itself
    }
  }
}

std::optional<absl::Status> ExchangeCall::ClaimRegion() {
  absl::StatusOr<ShmRegions::Claim> claim;
  const Parking parking = Park(Wait::kRegion, [&]() -> uint64_t {
    claim = r_.regions->TryClaim(
        shm_->region_handle(), asks_.header.worker(),
        [this](absl::StatusOr<ShmRegions::Claimed> region) {
          const bool go_on = Resume(Wait::kRegion);
          // An ended call drops the region on the pool, which hands it to
          // the worker's next exchange.
          r_.work->Post([this, go_on, region = std::move(region)]() mutable {
            if (go_on) {
              RegionClaimed(std::move(region));
              LeaveBusy();
            }
            Unref();
          });
        });
    return claim.ok() ? claim->parked : 0;
  });
  if (parking != Parking::kNoWait) return std::nullopt;
  Unref();
  if (!claim.ok()) return claim.status();
  return TakeRegion(std::move(claim->region));
}

void ExchangeCall::RegionClaimed(absl::StatusOr<ShmRegions::Claimed> region) {
  const absl::Status taken = region.ok() ? TakeRegion(*std::move(region)) : region.status();
  if (!taken.ok()) return End(taken);
  Enter(asks_.pushes ? Phase::kApplying : Phase::kPulling);
  Advance();
}

void ExchangeCall::AwaitTurn() {
  const Parking parking = Park(Wait::kShard, [this] {
    Enter(Phase::kAwaitingTurn);
    return r_.shard->AwaitUpdateTurnOrWait([this] { r_.work->Post([this] { TurnWoken(); }); });
  });
  // The turn came free meanwhile: tried again on the pool, not in here, so
  // that a turn taken again by another update cannot nest calls.
  if (parking == Parking::kNoWait) r_.work->Post([this] { TurnWoken(); });
}

void ExchangeCall::TurnWoken() {
  if (Resume(Wait::kShard)) {
    Enter(Phase::kApplying);
    Advance();
    LeaveBusy();
  }
  Unref();
}

void ExchangeCall::Pull() {
  std::shared_ptr<PullPayload> payload = r_.payloads->Take();
  const DType dtype = AnswerDType(asks_.pull);
  absl::Status unanswerable;
  const ParameterShard::PullVisitor visit = [&](int64_t version,
                                                const std::vector<const Variable*>& named,
                                                const PulledRows& rows) {
    static const std::vector<const Variable*> kNone;
    const std::vector<const Variable*>& variables = asks_.pulls_variables ? named : kNone;
    // A 16-bit answer is encoded into a buffer of the PS's own; float32 is
    // sent from the variables' buffers, and a shared answer lies in the
    // region, whose bounds hold it. Rows are encoded into the answer's
    // header, on either path.
    const bool encoded = !asks_.shared && DTypeBytes(dtype) != sizeof(float);
    unanswerable =
        CheckPullReply(encoded ? variables : kNone, rows, dtype, r_.limits->max_reply_bytes);
    if (!unanswerable.ok()) return;
    CapturePull(version, variables, dtype, payload.get());
    unanswerable = rows.AnswerTo(&payload->header);  // a disk tier's read error, if any
  };
  absl::StatusOr<ParameterShard::WaitId> waited;
  const Parking parking = Park(Wait::kShard, [&]() -> uint64_t {
    waited = r_.shard->PullVisitOrWait(
        asks_.pull, PullWaitDeadline(pull_start_, asks_.pull, call_deadline_, *r_.limits), visit,
        [this] { r_.answers->Post([this] { PullWoken(); }); });
    if (!waited.ok() || *waited == 0) return 0;
    Enter(Phase::kAwaitingVersion);
    return *waited;
  });
  if (parking != Parking::kNoWait) return;
  Unref();
  if (!waited.ok()) {
    payload->values.clear();  // nothing captured may stay pinned
    return End(waited.status());
  }
  if (!unanswerable.ok()) {
    payload->values.clear();
    return End(unanswerable);
  }
  Answer(payload);
}

void ExchangeCall::PullWoken() {
  if (Resume(Wait::kShard)) {
    Enter(Phase::kPulling);
    Pull();
    LeaveBusy();
  }
  Unref();
}

void ExchangeCall::Answer(const std::shared_ptr<PullPayload>& payload) {
  ExchangeDone done;
  if (asks_.pushes) *done.mutable_push() = push_response_;
  done.set_version(payload->header.version());
  Enter(Phase::kAnswered);
  const absl::Status sent =
      path_->SendPulled(payload, done, [this](grpc::ByteBuffer m) { Write(std::move(m)); });
  // The header went out as a copy: a large answer's rows need not wait in
  // the pool for the payload's next use.
  if (const int64_t rows = RowBytes(payload->header.rows()); rows >= kLargeRowBytes) {
    google::protobuf::RepeatedPtrField<EmbeddingRows>().Swap(payload->header.mutable_rows());
    large_rows_freed_ += rows;
  }
  End(sent);
}

void ExchangeCall::OnOver(const absl::Status& status) {
  const absl::Duration took = absl::Now() - start_;
  if (asks_.pushes) {
    RecordServedPush(traffic_.in, asks_.header.computed_at_version(), push_response_, status,
                     took);
  }
  if (asks_.pulls || phase_ == Phase::kReadingHeader) {
    RecordServedPull(status.ok() ? traffic_.out : 0, status, took);
  }
  // A large request of rows is freed now, not with the call, and counted.
  const int64_t asked = RowBytes(asks_.header.rows()) + RowBytes(asks_.pull.rows());
  if (asked >= kLargeRowBytes) {
    PushRequest().Swap(&asks_.header);
    PullRequest().Swap(&asks_.pull);
    large_rows_freed_ += asked;
  }
  // Gives back the staging of an update it never committed, its region
  // and its buffer.
  path_ = shm_ = nullptr;
  paths_.emplace<std::monostate>();
  if (buffer_ != nullptr) r_.return_push_buffer(std::move(buffer_));
}

}  // namespace

void AwaitExchange(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue) {
  (new ExchangeCall(resources, queue))->Request();
}

}  // namespace pst
