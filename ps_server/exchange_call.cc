#include "ps_server/exchange_call.h"

#include <atomic>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "grpc/grpc.h"
#include "common/tensor_codec.h"
#include "ps_server/ps_metrics.h"
#include "ps_server/shm_exchange.h"
#include "ps_server/streamed_update.h"
#include "rpc/completion_tag.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_status.h"
#include "rpc/worker_session.h"

namespace pst {
namespace {

// A shard whose share is this large takes an exchange's messages on the
// work pool: copying, decoding and applying them outlasts the hand-off,
// and the queue's thread stays free to take other calls' events. A smaller
// one takes them on the queue's thread, which saw them arrive.
constexpr int64_t kOffloadBytes = 1 << 20;

DType WireDType(DType dtype) { return dtype == DTYPE_UNSPECIFIED ? FLOAT32 : dtype; }

class ExchangeCall final {
 public:
  ExchangeCall(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue)
      : r_(resources), completion_queue_(queue), handle_(std::make_shared<Handle>()) {
    handle_->call = this;
  }

  // Asks gRPC for the next call; OnRequested runs once it has arrived.
  void Request();

 private:
  // The events of the call's operations.
  void OnRequested(bool ok);
  void OnReadDone(bool ok);
  // The read's work: take the message (or the request's end), and go on.
  void TakeRead(bool ok);
  void OnWriteDone(bool ok);
  void OnFinished(bool ok);
  // The call is over: finished, or cancelled (the worker went away, its
  // deadline passed, the watchdog ended it).
  void OnCallOver(bool ok);
  void OnCancel();
  // Once the call is over and none of its operations is in flight.
  void OnDone();
  // An operation's event has come (`call_over`: the call's end, or an
  // operation's; nullopt: a pool task's), and OnDone if it was the last
  // thing outstanding: the call is over, and no operation is in flight nor
  // pool task running.
  void Settle(std::optional<bool> call_over);

  void Begin();

  // What the idle watchdog holds of the call: the call until it is done.
  struct Handle {
    absl::Mutex mu;
    ExchangeCall* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  // The call is freed once gRPC is done with it (OnDone) and no pool task
  // or shard waiter still refers to it.
  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Reading the request.
  void ReadNext();
  // Whether the request holds all the exchange needs.
  bool RequestComplete() const;
  absl::Status TakeMessage();
  absl::Status TakeFirst();
  absl::Status Refuse(absl::Status status);  // a malformed request, counted as a rejected push
  absl::Status AdmitPush(const PushRequest& header, int64_t buffered);

  // After the request has ended: the push applied, then the pull. It
  // never blocks: where a step must wait (for the region, for the update's
  // turn, for the pull's version) it leaves a waiter and returns, and runs
  // again once woken.
  void Complete();
  // A shared exchange's push, once its region is claimed: staged straight
  // out of the region when the shard can stream it (ASYNC; nullopt while
  // another update holds the staging: the gradient waits where it lies),
  // else read into the buffer for Push.
  std::optional<absl::Status> TakeSharedPush();
  // Whether the pull asks for the pushed variables in the push's order, as
  // float32, and every gradient names its shape: the new values written as
  // the push is staged are then the whole answer.
  bool AnswerIsThePush() const;
  // Claims the shared region: nullopt while the claim is parked (Complete
  // runs again on the pool once the region is handed over).
  std::optional<absl::Status> ClaimRegion();
  absl::Status TakeRegion(ShmRegions::Claimed region);
  // Leaves a waiter for the update's turn; Complete runs again once woken.
  void AwaitTurn();
  void TurnWoken();
  // A pool task's end: lets the call be finished, and done.
  void LeaveBusy();
  void Pull();
  void PullWoken();
  void Answer(const std::shared_ptr<PullPayload>& payload);

  // The answer's messages go out one at a time, in order; the call is
  // finished once they are out (at once, dropping them, on an error).
  void Write(grpc::ByteBuffer message);
  void End(absl::Status status);
  // The watchdog's end: also while a write waits on the client.
  void EndIdle(const absl::Status& status);
  void Pump();
  bool Ended();

  const ExchangeResources r_;
  grpc::ServerCompletionQueue* const completion_queue_;
  grpc::ServerContext context_storage_;
  grpc::ServerContext* const context_ = &context_storage_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> call_{&context_storage_};
  MemberTag<ExchangeCall, &ExchangeCall::OnRequested> requested_tag_{this};
  MemberTag<ExchangeCall, &ExchangeCall::OnReadDone> read_tag_{this};
  MemberTag<ExchangeCall, &ExchangeCall::OnWriteDone> write_tag_{this};
  MemberTag<ExchangeCall, &ExchangeCall::OnFinished> finish_tag_{this};
  MemberTag<ExchangeCall, &ExchangeCall::OnCallOver> over_tag_{this};
  absl::Time start_;          // set as the call arrives
  bool offload_ = false;      // messages are taken on r_.work
  absl::Time call_deadline_;  // the client's
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  const std::shared_ptr<Handle> handle_;
  std::unique_ptr<OpenStreams::Stream> stream_;

  // The request, touched by one event or pool task at a time.
  grpc::ByteBuffer in_;
  ReceivedChunk chunk_;
  bool started_ = false;
  PushRequest header_;
  bool pushes_ = false;
  bool pulls_ = false;
  PullRequest pull_;
  bool shared_ = false;
  ShmTransfer transfer_;
  std::unique_ptr<PushRequest> buffer_;
  std::optional<PushIntake> intake_;
  std::optional<StagedAnswer> staged_;  // the answer streams during the push
  std::shared_ptr<const OpenedRegion> region_;
  std::unique_ptr<StreamedUpdate> shared_update_;  // staged out of the region
  bool shm_finite_ = false;
  bool shared_push_taken_ = false;
  bool shared_answered_ = false;  // the answer is in the region, written as staged
  bool pushed_ = false;
  PushResponse push_response_;
  int64_t bytes_in_ = 0;
  int64_t bytes_out_ = 0;
  absl::Time pull_start_;

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);  // front: being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<OpenStreams::Stream::ClientWait> read_wait_ ABSL_GUARDED_BY(mu_);
  std::optional<OpenStreams::Stream::ClientWait> write_wait_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Finish (or WriteAndFinish) called
  int busy_ ABSL_GUARDED_BY(mu_) = 0;           // pool tasks using the request's buffers
  bool done_ ABSL_GUARDED_BY(mu_) = false;      // OnDone: the call is over
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;      // operations started, their events not yet in
  bool over_ ABSL_GUARDED_BY(mu_) = false;      // OnCallOver has come
  ParameterShard::WaitId wait_ ABSL_GUARDED_BY(mu_) = 0;
  ShmRegions::ClaimId claim_ ABSL_GUARDED_BY(mu_) = 0;
};

void ExchangeCall::Request() {
  // Told when the call is over, whether it ends by Finish or by
  // cancellation; never for a request the server's shutdown ends.
  context_->AsyncNotifyWhenDone(&over_tag_);
  r_.service->RequestExchange(context_, &call_, completion_queue_, completion_queue_, &requested_tag_);
}

void ExchangeCall::OnRequested(bool ok) {
  if (!ok) {  // the server is shutting down: no call came
    delete this;
    return;
  }
  // The next call is requested before this one is served, so that calls
  // never wait for each other to arrive.
  (new ExchangeCall(r_, completion_queue_))->Request();
  start_ = absl::Now();
  call_deadline_ = absl::FromChrono(context_->deadline());
  offload_ = r_.shard->parameter_bytes() >= kOffloadBytes;
  Begin();
}

void ExchangeCall::Settle(std::optional<bool> call_over) {
  {
    absl::MutexLock lock(&mu_);
    if (call_over == true) {
      over_ = true;
    } else if (call_over == false) {
      --in_flight_;
    }
    if (!over_ || in_flight_ > 0 || busy_ > 0 || done_) return;
    done_ = true;
  }
  OnDone();
}

void ExchangeCall::OnFinished(bool /*ok: false where the call was cancelled first*/) {
  Settle(/*call_over=*/false);
}

void ExchangeCall::OnCallOver(bool /*ok*/) {
  if (context_->IsCancelled()) OnCancel();
  Settle(/*call_over=*/true);
}

void ExchangeCall::Begin() {
  stream_ = r_.streams->Admit([handle = handle_](const absl::Status& status) {
    ExchangeCall* call = nullptr;
    {
      absl::MutexLock lock(&handle->mu);
      call = handle->call;
      if (call != nullptr) call->Ref();
    }
    if (call == nullptr) return;
    call->EndIdle(status);
    call->Unref();
  });
  buffer_ = r_.take_push_buffer();
  ReadNext();
}

void ExchangeCall::ReadNext() {
  {
    absl::MutexLock lock(&mu_);
    if (end_) return;
    read_wait_.emplace(stream_.get());
    ++in_flight_;
  }
  call_.Read(&in_, &read_tag_);
}

void ExchangeCall::OnReadDone(bool ok) {
  if (!ok || !offload_) {
    TakeRead(ok);
    // The call is not done before the read's work is: Settle comes last.
    Settle(/*call_over=*/false);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++busy_;
  }
  r_.work->Post([this] {
    TakeRead(/*ok=*/true);
    LeaveBusy();
    Settle(/*call_over=*/false);
  });
}

void ExchangeCall::TakeRead(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    read_wait_.reset();
    if (end_) return;
  }
  if (!ok) {
    if (context_->IsCancelled()) {
      End(absl::CancelledError("the worker went away during the exchange"));
    } else if (!started_) {
      // Not counted as a rejected push: there was none (and a request gRPC
      // refused as too large ends here too).
      End(absl::InvalidArgumentError("the exchange was empty: no header"));
    } else {
      Complete();
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
  if (RequestComplete()) {
    stream_->ReceivedAll();
    return Complete();
  }
  ReadNext();
}

bool ExchangeCall::RequestComplete() const {
  if (!pushes_ || shared_) return true;
  return intake_.has_value() && intake_->complete();
}

absl::Status ExchangeCall::Refuse(absl::Status status) {
  r_.shard->CountRejectedPush();
  return status;
}

absl::Status ExchangeCall::AdmitPush(const PushRequest& header, int64_t buffered) {
  PST_RETURN_IF_ERROR(CheckPushSize(header, *r_.limits));
  PST_RETURN_IF_ERROR(stream_->ClaimWorker(header.worker()));
  if (buffered > 0) return stream_->ReservePushBuffer(buffered);
  return absl::OkStatus();
}

absl::Status ExchangeCall::TakeMessage() {
  bytes_in_ += static_cast<int64_t>(in_.Length());
  stream_->Received(static_cast<int64_t>(in_.Length()));
  if (absl::Status s = chunk_.Parse(&in_); !s.ok()) return Refuse(s);
  if (!started_) {
    started_ = true;
    PST_RETURN_IF_ERROR(TakeFirst());
  } else if (chunk_.has_header() || chunk_.has_extra() || chunk_.has_shm()) {
    return Refuse(absl::InvalidArgumentError("an exchange carries a second header"));
  }
  if (chunk_.pieces().empty()) return absl::OkStatus();
  if (!pushes_ || shared_) {
    return Refuse(absl::InvalidArgumentError(
        shared_ ? "an exchange through shared memory carries no pieces"
                : "an exchange that pushes nothing (no gradients in its header) carries pieces"));
  }
  PST_RETURN_IF_ERROR(intake_->Take(chunk_));
  if (staged_) {
    staged_->Add(chunk_, *intake_->update());
    // The last values wait for the push's outcome, so that an exchange of
    // one chunk is answered in one message.
    if (!intake_->complete()) Write(staged_->Take(nullptr));
  }
  return absl::OkStatus();
}

absl::Status ExchangeCall::TakeFirst() {
  if (!chunk_.has_header()) {
    return Refuse(absl::InvalidArgumentError(
        "an exchange must start with its header (ExchangeChunk.header)"));
  }
  if (!chunk_.ParseHeader(&header_)) {
    return Refuse(absl::InvalidArgumentError("an exchange's header is not a PushRequest"));
  }
  pushes_ = header_.gradients_size() > 0;
  pulls_ = chunk_.has_extra();
  if (pulls_ && !chunk_.ParseExtra(&pull_)) {
    return Refuse(absl::InvalidArgumentError("an exchange's pull is not a PullRequest"));
  }
  shared_ = chunk_.has_shm();
  if (shared_ && !chunk_.ParseShm(&transfer_)) {
    return Refuse(absl::InvalidArgumentError("an exchange's shm is not a ShmTransfer"));
  }
  if (!pushes_ && !pulls_) {
    return absl::InvalidArgumentError(
        "an exchange with neither a push (gradients in its header) nor a pull");
  }
  const int worker = header_.worker();
  if (r_.task_tokens) {
    PST_RETURN_IF_ERROR(CheckActsAs(*context_, worker));
  }
  PST_RETURN_IF_ERROR(r_.sessions->Admit(worker, SessionOf(*context_)));
  if (pulls_) {
    pull_.set_worker(worker);
    if (DTypeBytes(pull_.dtype()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown wire dtype ", static_cast<int>(pull_.dtype()), " in an exchange's pull"));
    }
    if (pushes_) {
      AskForPushedVariables(header_, &pull_);
    } else if (absl::Status s = CheckPullNames(pull_, *r_.limits); !s.ok()) {
      return s;
    }
  }
  if (shared_ || !pushes_) return stream_->ClaimWorker(worker);
  intake_.emplace(r_.shard, buffer_.get());
  const PushIntake::Admit admit = [this](const PushRequest& header, int64_t buffered) {
    return AdmitPush(header, buffered);
  };
  // Called with the shard's lock held, while the update exists: the call
  // is not done (OnDone drops the update, which takes that lock), and
  // TryCancel runs none of its events here.
  auto cancel = [context = context_] { context->TryCancel(); };
  PST_RETURN_IF_ERROR(intake_->Begin(header_, admit, cancel));
  if (pulls_ && intake_->update() != nullptr &&
      r_.shard->policy().AnswerMayStreamDuringPush(pull_.min_version(),
                                                   header_.computed_at_version())) {
    staged_.emplace(header_, pull_.dtype(), r_.payloads->Take());
  }
  return absl::OkStatus();
}

void ExchangeCall::AwaitTurn() {
  ParameterShard::WaitId waited = 0;
  {
    // Held while the waiter is left, so that OnCancel finds it.
    absl::MutexLock lock(&mu_);
    if (end_) return;
    Ref();  // the waiter's, or the task's below
    waited = r_.shard->AwaitUpdateTurnOrWait([this] { r_.work->Post([this] { TurnWoken(); }); });
    if (waited != 0) {
      wait_ = waited;
      return;
    }
  }
  // The turn came free meanwhile: tried again on the pool, not in here, so
  // that a turn taken again by another update cannot nest calls.
  r_.work->Post([this] { TurnWoken(); });
}

void ExchangeCall::TurnWoken() {
  bool go_on = false;
  {
    absl::MutexLock lock(&mu_);
    wait_ = 0;
    go_on = !end_.has_value();
    if (go_on) ++busy_;  // the call is not finished under the task
  }
  if (go_on) {
    Complete();
    LeaveBusy();
  }
  Unref();
}

void ExchangeCall::LeaveBusy() {
  {
    absl::MutexLock lock(&mu_);
    --busy_;
  }
  Pump();
  // The call may have come to its end while the task ran.
  Settle(std::nullopt);
}

void ExchangeCall::Complete() {
  if (Ended()) return;
  if (shared_ && region_ == nullptr) {
    std::optional<absl::Status> claimed = ClaimRegion();
    if (!claimed) return;  // parked: Complete runs again once the region is this call's
    if (!claimed->ok()) return End(*claimed);
  }
  if (shared_ && pushes_ && !shared_push_taken_) {
    std::optional<absl::Status> taken = TakeSharedPush();
    if (!taken) return AwaitTurn();  // behind another update: staged once that is in
    if (!taken->ok()) return End(*taken);
    shared_push_taken_ = true;
  }
  if (pushes_ && !pushed_) {
    std::optional<absl::Status> applied;
    if (shared_update_ != nullptr) {
      applied = r_.shard->CommitStreamedPush(std::move(shared_update_), &push_response_);
    } else if (shared_) {
      // A non-finite value is left to the shard to refuse (and count).
      applied = r_.shard->TryPush(*buffer_, &push_response_, {.values_finite = shm_finite_});
    } else {
      applied = intake_->Finish(&push_response_);
    }
    if (!applied) return AwaitTurn();  // its turn comes behind another update
    pushed_ = true;
    if (!applied->ok()) return End(*applied);
  }
  ExchangeDone done;
  if (pushes_) *done.mutable_push() = push_response_;
  if (!pulls_) {
    region_.reset();  // the worker's next exchange may claim it
    ChunkBuilder builder;
    builder.SetExtra(done);
    Write(builder.Finish());
    return End(absl::OkStatus());
  }
  if (staged_) {
    // The answer went out as it was staged; the push is committed now.
    done.set_version(push_response_.version());
    Write(staged_->Take(&done));
    return End(absl::OkStatus());
  }
  if (shared_answered_) {
    // The answer was written into the region as it was staged: the
    // committed values.
    region_.reset();  // the worker's next exchange may claim it
    PullResponse answer = PushedVariablesHeader(header_, FLOAT32);
    answer.set_version(push_response_.version());
    done.set_version(push_response_.version());
    ChunkBuilder builder;
    builder.SetHeader(answer);
    builder.SetExtra(done);
    Write(builder.Finish());
    return End(absl::OkStatus());
  }
  pull_start_ = absl::Now();
  Pull();
}

std::optional<absl::Status> ExchangeCall::ClaimRegion() {
  absl::StatusOr<ShmRegions::Claim> claim;
  {
    // Held while the claim is parked, so that OnCancel finds it.
    absl::MutexLock lock(&mu_);
    if (end_) return *end_;
    Ref();  // the parked claim's, if it is parked
    claim = r_.regions->TryClaim(
        transfer_.region(), header_.worker(),
        [this](absl::StatusOr<ShmRegions::Claimed> region) {
          {
            absl::MutexLock lock(&mu_);
            claim_ = 0;
            ++busy_;  // the call is not finished under the task
          }
          r_.work->Post([this, region = std::move(region)]() mutable {
            const absl::Status taken =
                region.ok() ? TakeRegion(*std::move(region)) : region.status();
            if (taken.ok()) {
              Complete();
            } else {
              End(taken);
            }
            LeaveBusy();
            Unref();
          });
        });
    if (claim.ok() && claim->parked != 0) {
      claim_ = claim->parked;
      return std::nullopt;
    }
  }
  Unref();
  if (!claim.ok()) return claim.status();
  return TakeRegion(std::move(claim->region));
}

absl::Status ExchangeCall::TakeRegion(ShmRegions::Claimed region) {
  region_ = std::move(region);
  // A push's ranges are checked as they are read; a pull alone checks here.
  return pushes_ ? absl::OkStatus() : region_->CheckNotShrunk();
}

std::optional<absl::Status> ExchangeCall::TakeSharedPush() {
  const DType dtype = pull_.dtype();
  const DType* answer_dtype = pulls_ ? &dtype : nullptr;
  absl::StatusOr<ParameterShard::StreamedPush> push = r_.shard->BeginStreamedPush(header_);
  if (!push.ok()) return push.status();  // counted by the shard
  // The gradient waits where it lies for the update staging before it,
  // then is staged out of the region: a copy of it would be one more pass.
  if (push->update == nullptr && push->awaits_turn) return std::nullopt;
  if (push->update == nullptr) {
    // Read whole, for Push to apply in its turn (SYNC sums it into the
    // step); a non-finite value is left to the shard to refuse (and count).
    absl::Status read = ReadShmPush(header_, push->bytes, transfer_, answer_dtype, *region_,
                                    *r_.limits, buffer_.get(), &shm_finite_, &bytes_in_);
    return read.ok() ? read : Refuse(read);
  }
  // Where the answer may flow during the push (as a TCP exchange's
  // streams), each block's new values are written into the region as they
  // are staged, from cache; otherwise the answer is pulled once the update
  // is committed, as for a push read whole.
  const bool answer_as_staged = pulls_ && AnswerIsThePush() &&
                                r_.shard->policy().AnswerMayStreamDuringPush(
                                    pull_.min_version(), header_.computed_at_version());
  if (absl::Status staged =
          StageShmPush(header_, push->bytes, transfer_, answer_dtype, *region_, *r_.limits,
                       push->update.get(), &bytes_in_, answer_as_staged);
      !staged.ok()) {
    return Refuse(staged);  // the update is dropped: nothing of it lands
  }
  if (answer_as_staged) {
    shared_answered_ = true;
    for (int i = 0; i < header_.gradients_size(); ++i) {
      bytes_out_ += push->bytes[i] / DTypeBytes(header_.gradients(i).dtype()) *
                    static_cast<int64_t>(sizeof(float));
    }
  }
  shared_update_ = std::move(push->update);
  return absl::OkStatus();
}

bool ExchangeCall::AnswerIsThePush() const {
  if (WireDType(pull_.dtype()) != FLOAT32 || pull_.names_size() != header_.gradients_size()) {
    return false;
  }
  for (int i = 0; i < header_.gradients_size(); ++i) {
    const Tensor& gradient = header_.gradients(i);
    if (pull_.names(i) != gradient.name() || gradient.shape().empty()) return false;
  }
  return true;
}

void ExchangeCall::Pull() {
  std::shared_ptr<PullPayload> payload = r_.payloads->Take();
  const DType dtype = WireDType(pull_.dtype());
  absl::Status too_large;
  const ParameterShard::PullVisitor visit = [&](int64_t version,
                                                const std::vector<const Variable*>& variables) {
    // A 16-bit answer is encoded into a buffer of the PS's own; float32 is
    // sent from the variables' buffers, and a shared answer lies in the
    // region, whose bounds hold it.
    if (!shared_ && DTypeBytes(dtype) != sizeof(float)) {
      too_large = CheckPullReply(variables, dtype, r_.limits->max_reply_bytes);
      if (!too_large.ok()) return;
    }
    CapturePull(version, variables, dtype, payload.get());
  };
  absl::StatusOr<ParameterShard::WaitId> waited;
  {
    // Held while the waiter is left, so that OnCancel finds it.
    absl::MutexLock lock(&mu_);
    if (end_) return;
    Ref();  // the waiter's, if one is left
    waited = r_.shard->PullVisitOrWait(
        pull_, PullWaitDeadline(pull_start_, pull_, call_deadline_, *r_.limits), visit,
        [this] { r_.answers->Post([this] { PullWoken(); }); });
    if (waited.ok() && *waited != 0) {
      wait_ = *waited;
      return;
    }
  }
  Unref();
  if (!waited.ok()) {
    payload->values.clear();  // nothing captured may stay pinned
    return End(waited.status());
  }
  if (!too_large.ok()) return End(too_large);
  Answer(payload);
}

void ExchangeCall::PullWoken() {
  bool pull = false;
  {
    absl::MutexLock lock(&mu_);
    wait_ = 0;
    pull = !end_.has_value();
    if (pull) ++busy_;  // the call is not finished under the pull
  }
  if (pull) {
    Pull();
    LeaveBusy();
  }
  Unref();
}

void ExchangeCall::Answer(const std::shared_ptr<PullPayload>& payload) {
  ExchangeDone done;
  if (pushes_) *done.mutable_push() = push_response_;
  done.set_version(payload->header.version());
  if (shared_) {
    int64_t written = 0;
    absl::Status status =
        WriteShmAnswer(payload.get(), *region_, transfer_.answer_offset(), &written);
    region_.reset();  // the worker's next exchange may claim it
    if (!status.ok()) return End(status);
    bytes_out_ += written;
    ChunkBuilder builder;
    builder.SetHeader(payload->header);
    builder.SetExtra(done);
    Write(builder.Finish());
    return End(absl::OkStatus());
  }
  bytes_out_ += SendPullPayload(
      payload,
      [this](const grpc::ByteBuffer& message, bool /*last: End follows*/) {
        Write(message);
        return true;
      },
      &done);
  End(absl::OkStatus());
}

bool ExchangeCall::Ended() {
  absl::MutexLock lock(&mu_);
  return end_.has_value();
}

void ExchangeCall::Write(grpc::ByteBuffer message) {
  {
    absl::MutexLock lock(&mu_);
    if (end_) return;
    queue_.push_back(std::move(message));
  }
  Pump();
}

void ExchangeCall::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (end_) return;
    end_ = status;
    if (!status.ok()) {
      // What is not yet being written is not sent.
      while (queue_.size() > (writing_ ? 1u : 0u)) queue_.pop_back();
    }
  }
  // The worker's next exchange may come before gRPC is done with this one.
  if (stream_ != nullptr) stream_->Release();
  Pump();
}

void ExchangeCall::EndIdle(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!end_) {
      end_ = status;
      while (queue_.size() > (writing_ ? 1u : 0u)) queue_.pop_back();
    }
    if (done_) return;
    if (finished_ || busy_ > 0 || writing_) {
      // A write the client does not read would hold a Finish back: the call
      // is cancelled with the status instead, its pending operations fail,
      // and the call ends (Pump finishes it once nothing is in flight).
      // Safe under mu_: cancelling runs none of the call's events here.
      const std::string message(status.message());
      grpc_call_cancel_with_status(context_->c_call(),
                                   static_cast<grpc_status_code>(status.code()),
                                   message.c_str(), nullptr);
      return;
    }
  }
  Pump();
}

void ExchangeCall::Pump() {
  const grpc::ByteBuffer* message = nullptr;
  grpc::Status status;
  enum { kWrite, kWriteAndFinish, kFinish } action;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || writing_ || busy_ > 0 || done_) return;
    if (!queue_.empty()) {
      message = &queue_.front();
      writing_ = true;
      write_wait_.emplace(stream_.get());
      action = kWrite;
      if (end_ && end_->ok() && queue_.size() == 1) {
        finished_ = true;
        action = kWriteAndFinish;
      }
    } else if (end_) {
      finished_ = true;
      status = ToGrpcStatus(*end_);
      action = kFinish;
    } else {
      return;
    }
    ++in_flight_;
  }
  switch (action) {
    case kWrite:
      call_.Write(*message, &write_tag_);
      break;
    case kWriteAndFinish:
      // One event for both: it comes as a write's.
      call_.WriteAndFinish(*message, grpc::WriteOptions(), grpc::Status::OK, &write_tag_);
      break;
    case kFinish:
      call_.Finish(status, &finish_tag_);
      break;
  }
}

void ExchangeCall::OnWriteDone(bool ok) {
  absl::Cleanup settle = [this] { Settle(/*call_over=*/false); };
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    write_wait_.reset();
    queue_.pop_front();
    if (!ok && !end_) {
      end_ = absl::CancelledError("the worker went away while its answer was sent");
      queue_.clear();
    }
  }
  Pump();
}

void ExchangeCall::OnCancel() {
  ParameterShard::WaitId waiting = 0;
  ShmRegions::ClaimId claim = 0;
  {
    absl::MutexLock lock(&mu_);
    waiting = wait_;
    claim = claim_;
  }
  if (waiting != 0 && r_.shard->CancelWait(waiting)) Unref();  // the waiter's
  if (claim != 0 && r_.regions->CancelClaim(claim)) Unref();  // the parked claim's
  End(absl::CancelledError("the worker went away during the exchange"));
}

void ExchangeCall::OnDone() {
  {
    absl::MutexLock lock(&handle_->mu);
    handle_->call = nullptr;
  }
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    read_wait_.reset();
    write_wait_.reset();
    status = end_.value_or(absl::OkStatus());
  }
  // Nothing else touches the request now: no event is running, and no
  // pool task that does (busy_) was, or the call would not be finished.
  const absl::Duration took = absl::Now() - start_;
  if (pushes_) {
    RecordServedPush(bytes_in_, header_.computed_at_version(), push_response_, status, took);
  }
  if (pulls_ || !started_) RecordServedPull(status.ok() ? bytes_out_ : 0, status, took);
  // Gives back the call's place, its worker's, its push budget, the
  // staging of an update it never committed, its region and its buffer.
  intake_.reset();
  staged_.reset();
  shared_update_.reset();
  region_.reset();
  stream_.reset();
  if (buffer_ != nullptr) r_.return_push_buffer(std::move(buffer_));
  Unref();
}

}  // namespace

void AwaitExchange(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue) {
  (new ExchangeCall(resources, queue))->Request();
}

}  // namespace pst
