#include "ps_server/service/exchange_rpc.h"

#include <string>

#include "absl/cleanup/cleanup.h"
#include "grpc/grpc.h"
#include "rpc/grpc_status.h"

namespace pst {
namespace {

// A shard whose share is this large takes an exchange's messages on the
// work pool: copying, decoding and applying them outlasts the hand-off,
// and the queue's thread stays free to take other calls' events.
constexpr int64_t kOffloadBytes = 1 << 20;

}  // namespace

ExchangeRpc::ExchangeRpc(const ExchangeResources& resources, grpc::ServerCompletionQueue* queue)
    : r_(resources), completion_queue_(queue), handle_(std::make_shared<Handle>()) {
  handle_->call = this;
}

void ExchangeRpc::Request() {
  // Told when the call is over, whether it ends by Finish or by
  // cancellation; never for a request the server's shutdown ends.
  context_.AsyncNotifyWhenDone(&over_tag_);
  r_.service->RequestExchange(&context_, &call_, completion_queue_, completion_queue_,
                              &requested_tag_);
}

void ExchangeRpc::OnRequested(bool ok) {
  if (!ok) {  // the server is shutting down: no call came
    delete this;
    return;
  }
  Next()->Request();
  offload_ = r_.shard->parameter_bytes() >= kOffloadBytes;
  stream_ = r_.streams->Admit([handle = handle_](const absl::Status& status) {
    ExchangeRpc* call = nullptr;
    {
      absl::MutexLock lock(&handle->mu);
      call = handle->call;
      if (call != nullptr) call->Ref();
    }
    if (call == nullptr) return;
    call->EndIdle(status);
    call->Unref();
  });
  OnArrived();
  LeaveArrival();
}

void ExchangeRpc::LeaveArrival() {
  {
    absl::MutexLock lock(&mu_);
    --busy_;
    // A call that has not ended is not over either: Pump and Settle would
    // find nothing to do.
    if (!end_) return;
    // Once the lock is released, another thread's Settle (a write that
    // completes) may finish the call: it is kept until these return.
    Ref();
  }
  Pump();
  Settle(/*operation_ended=*/false);
  Unref();
}

void ExchangeRpc::Read() {
  {
    absl::MutexLock lock(&mu_);
    if (end_) return;
    read_wait_.emplace(stream_.get());
    ++in_flight_;
  }
  call_.Read(&in_, &read_tag_);
}

void ExchangeRpc::OnReadDone(bool ok) {
  if (!ok || !offload_) {
    TakeRead(ok);
    // The call is not done before the read's work is: Settle comes last.
    Settle(/*operation_ended=*/true);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++busy_;
  }
  r_.work->Post([this] {
    TakeRead(/*ok=*/true);
    LeaveBusy();
    Settle(/*operation_ended=*/true);
  });
}

void ExchangeRpc::TakeRead(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    read_wait_.reset();
    if (end_) return;
  }
  OnRead(ok);
}

ExchangeRpc::Parking ExchangeRpc::Park(Wait wait, absl::FunctionRef<uint64_t()> leave) {
  absl::MutexLock lock(&mu_);
  if (end_) return Parking::kEnded;
  Ref();  // the waiter's, or the caller's
  const uint64_t id = leave();
  if (id == 0) return Parking::kNoWait;
  *WaitSlot(wait) = id;
  return Parking::kWaiting;
}

bool ExchangeRpc::Resume(Wait wait) {
  absl::MutexLock lock(&mu_);
  *WaitSlot(wait) = 0;
  if (end_) return false;
  ++busy_;  // the call is not finished under the task
  return true;
}

void ExchangeRpc::LeaveBusy() {
  {
    absl::MutexLock lock(&mu_);
    --busy_;
    Ref();  // as in LeaveArrival: no other Settle frees it under these
  }
  Pump();
  // The call may have come to its end while the task ran.
  Settle(/*operation_ended=*/false);
  Unref();
}

bool ExchangeRpc::Ended() {
  absl::MutexLock lock(&mu_);
  return end_.has_value();
}

void ExchangeRpc::Write(grpc::ByteBuffer message) {
  {
    absl::MutexLock lock(&mu_);
    if (end_) return;
    queue_.push_back(std::move(message));
  }
  Pump();
}

void ExchangeRpc::DropUnsent() {
  const bool writing = wire_ == Wire::kWriting || wire_ == Wire::kWritingLast;
  while (queue_.size() > (writing ? 1u : 0u)) queue_.pop_back();
}

void ExchangeRpc::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (end_) return;
    end_ = status;
    if (!status.ok()) DropUnsent();
  }
  // The worker's next exchange may come before gRPC is done with this one.
  if (stream_ != nullptr) stream_->Release();
  Pump();
}

void ExchangeRpc::EndIdle(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (!end_) {
      end_ = status;
      DropUnsent();
    }
    if (wire_ == Wire::kDone) return;
    if (wire_ != Wire::kIdle || busy_ > 0) {
      // A write the client does not read would hold a Finish back: the call
      // is cancelled with the status instead, its pending operations fail,
      // and the call ends (Pump finishes it once nothing is in flight).
      // Safe under mu_: cancelling runs none of the call's events here.
      const std::string message(status.message());
      grpc_call_cancel_with_status(context_.c_call(), static_cast<grpc_status_code>(status.code()),
                                   message.c_str(), nullptr);
      return;
    }
  }
  Pump();
}

void ExchangeRpc::Pump() {
  const grpc::ByteBuffer* message = nullptr;
  grpc::Status status;
  Wire started;
  {
    absl::MutexLock lock(&mu_);
    if (wire_ != Wire::kIdle || busy_ > 0) return;
    if (!queue_.empty()) {
      message = &queue_.front();
      write_wait_.emplace(stream_.get());
      // The last message goes with the status: one event for both.
      const bool last = end_ && end_->ok() && queue_.size() == 1;
      EnterWire(last ? Wire::kWritingLast : Wire::kWriting);
    } else if (end_) {
      status = ToGrpcStatus(*end_);
      EnterWire(Wire::kFinishing);
    } else {
      return;
    }
    started = wire_;
    ++in_flight_;
  }
  switch (started) {
    case Wire::kWriting:
      call_.Write(*message, &write_tag_);
      break;
    case Wire::kWritingLast:
      call_.WriteAndFinish(*message, grpc::WriteOptions(), grpc::Status::OK, &write_tag_);
      break;
    default:
      call_.Finish(status, &finish_tag_);
      break;
  }
}

void ExchangeRpc::OnWriteDone(bool ok) {
  absl::Cleanup settle = [this] { Settle(/*operation_ended=*/true); };
  {
    absl::MutexLock lock(&mu_);
    EnterWire(wire_ == Wire::kWriting ? Wire::kIdle : Wire::kFinishing);
    write_wait_.reset();
    queue_.pop_front();
    if (!ok && !end_) {
      end_ = absl::CancelledError("the worker went away while its answer was sent");
      queue_.clear();
    }
  }
  Pump();
}

void ExchangeRpc::OnFinished(bool /*ok: false where the call was cancelled first*/) {
  Settle(/*operation_ended=*/true);
}

void ExchangeRpc::OnCallOver(bool /*ok*/) {
  if (context_.IsCancelled()) OnCancel();
  Settle(/*operation_ended=*/true);
}

void ExchangeRpc::OnCancel() {
  uint64_t shard_wait = 0;
  uint64_t region_wait = 0;
  {
    absl::MutexLock lock(&mu_);
    shard_wait = shard_wait_;
    region_wait = region_wait_;
  }
  if (shard_wait != 0 && r_.shard->CancelWait(shard_wait)) Unref();  // the waiter's
  if (region_wait != 0 && r_.regions->CancelClaim(region_wait)) Unref();  // the parked claim's
  End(absl::CancelledError("the worker went away during the exchange"));
}

void ExchangeRpc::Settle(bool operation_ended) {
  {
    absl::MutexLock lock(&mu_);
    if (operation_ended) --in_flight_;
    if (in_flight_ > 0 || busy_ > 0 || wire_ == Wire::kDone) return;
    EnterWire(Wire::kDone);
  }
  OnDone();
}

void ExchangeRpc::OnDone() {
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
  OnOver(status);
  // Gives back the call's place, its worker's and its push budget.
  stream_.reset();
  Unref();
}

}  // namespace pst
