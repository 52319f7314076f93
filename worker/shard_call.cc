#include "worker/shard_call.h"

#include "rpc/chunk_wire.h"
#include "rpc/grpc_status.h"

namespace pst {

ShardCall::ShardCall(grpc::GenericStub* stub, absl::Duration deadline, TakeAnswer take,
                     OnEnd on_end)
    : take_(std::move(take)), on_end_(std::move(on_end)) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  // The call's headers go with its first message: one frame fewer for an
  // exchange of one message each way.
  context_.set_initial_metadata_corked(true);
  stub->PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
  // Writes may be queued from outside the callbacks until the last one: the
  // hold keeps the call open for them.
  AddHold();
}

ShardCall::~ShardCall() {
  bool started = false;
  {
    absl::MutexLock lock(&mu_);
    started = started_;
  }
  if (!started) {
    // A prepared call must still be started to be done with.
    Start();
  }
  if (!done_.HasBeenNotified()) Cancel();
  done_.WaitForNotification();
}

void ShardCall::Start() {
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  StartRead(&in_);
  StartCall();
  Pump();
}

bool ShardCall::Write(grpc::ByteBuffer message, bool last) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
    queue_.push_back({std::move(message), last});
  }
  Pump();
  return true;
}

void ShardCall::Pump() {
  const Outgoing* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || writing_ || failed_ || queue_.empty()) return;
    writing_ = true;
    next = &queue_.front();
  }
  if (next->last) {
    StartWriteLast(&next->message, grpc::WriteOptions());
  } else {
    StartWrite(&next->message);
  }
}

void ShardCall::ReleaseHold() {
  // Not while a write is being issued: the hold is what keeps the call
  // open until that write is in flight.
  if (!holding_ || writing_ || !(failed_ || last_written_)) return;
  holding_ = false;
  RemoveHold();  // schedules OnDone, never runs it here
}

void ShardCall::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    last_written_ = queue_.front().last;
    queue_.pop_front();
    if (!ok) {
      failed_ = true;
      queue_.clear();
    }
    ReleaseHold();
  }
  Pump();
}

void ShardCall::OnReadDone(bool ok) {
  if (!ok) {
    // The answer has ended: the shard has finished the call, and nothing
    // more may be written.
    absl::MutexLock lock(&mu_);
    failed_ = true;
    queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
    ReleaseHold();
    return;
  }
  absl::Status taken = take_(&in_);
  if (!taken.ok()) {
    problem_ = std::move(taken);
    context_.TryCancel();
    return;
  }
  if (answered_) {
    answer_.Notify();
    return;
  }
  StartRead(&in_);
}

void ShardCall::OnDone(const grpc::Status& status) {
  status_ = !problem_.ok() ? problem_ : FromGrpcStatus(status);
  if (on_end_) on_end_(status_);
  if (!answer_.HasBeenNotified()) answer_.Notify();
  done_.Notify();
}

void ShardCall::AnswerComplete() { answered_ = true; }

void ShardCall::Cancel() {
  context_.TryCancel();
  absl::MutexLock lock(&mu_);
  failed_ = true;
  queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
  ReleaseHold();
}

absl::Status ShardCall::Wait() {
  answer_.WaitForNotification();
  // A whole answer is a success; the status that follows it says so too.
  if (answered_ && problem_.ok()) return absl::OkStatus();
  done_.WaitForNotification();
  return status_;
}

}  // namespace pst
