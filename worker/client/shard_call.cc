#include "worker/client/shard_call.h"

#include "rpc/chunk_wire.h"
#include "rpc/grpc_status.h"
#include "rpc/worker_session.h"

namespace pst {

namespace {
// The method's path, kept for the process's life: gRPC holds on to the
// string while it makes a call.
const std::string& ExchangeMethod() {
  static const std::string* const method = new std::string(kExchangeMethod);
  return *method;
}
}  // namespace

ShardCall::ShardCall(grpc::GenericStub* stub, CompletionDriver* driver, absl::Duration deadline,
                     TakeAnswer take, OnEnd on_end, Shape shape)
    : stub_(stub),
      driver_(driver),
      shape_(shape),
      take_(std::move(take)),
      on_end_(std::move(on_end)) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  AddProcessSession(&context_);
  // The call's headers go with its first message: one frame fewer for an
  // exchange of one message each way.
  context_.set_initial_metadata_corked(true);
}

ShardCall::~ShardCall() {
  bool issued = false;
  {
    absl::MutexLock lock(&mu_);
    issued = issued_;
  }
  if (!issued) return;
  // A whole answer is followed by the shard's status: it is waited for, not
  // cancelled.
  if (!Answered()) Cancel();
  driver_->WaitUntil([this] { return Over(); });
}

bool ShardCall::Over() {
  absl::MutexLock lock(&mu_);
  return done_;
}

bool ShardCall::Answered() {
  absl::MutexLock lock(&mu_);
  return done_ || answered_;
}

void ShardCall::Start() {
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
    if (shape_ == Shape::kOneEachWay) return;  // made with its message
    issued_ = true;
    reading_ = true;
    call_ = stub_->PrepareCall(&context_, ExchangeMethod(), driver_->queue());
    // With the headers corked, StartCall only queues them for the first
    // write: its tag never comes back.
    call_->StartCall(nullptr);
    call_->Read(&in_, &read_tag_);
  }
  Pump();
}

bool ShardCall::Write(grpc::ByteBuffer message, bool last) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
    if (shape_ == Shape::kOneEachWay) {
      if (!started_ || issued_ || !last) {
        problem_ = absl::InternalError("a one-message exchange was given another message");
        failed_ = true;
        if (issued_) context_.TryCancel();
        return false;
      }
      issued_ = true;
      failed_ = true;  // no more messages
      finishing_ = true;
      unary_call_ = stub_->PrepareUnaryCall(&context_, ExchangeMethod(), message, driver_->queue());
      unary_call_->StartCall();
      unary_call_->Finish(&in_, &grpc_status_, &finish_tag_);
      return true;
    }
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
    call_->WriteLast(next->message, grpc::WriteOptions(), &write_tag_);
  } else {
    call_->Write(next->message, &write_tag_);
  }
}

void ShardCall::MaybeFinish() {
  if (!issued_ || finishing_ || reading_ || writing_) return;
  if (!(read_ended_ || answered_ || failed_)) return;
  finishing_ = true;
  call_->Finish(&grpc_status_, &finish_tag_);
}

void ShardCall::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    const bool last = queue_.front().last;
    queue_.pop_front();
    if (!ok || last) {
      // Nothing more goes out: the request is whole, or the call is over.
      failed_ = !ok;
      queue_.clear();
      if (last) failed_ = true;
    }
    MaybeFinish();
  }
  Pump();
}

void ShardCall::OnReadDone(bool ok) {
  if (!ok) {
    // The answer has ended: the shard has finished the call, and nothing
    // more may be written.
    absl::MutexLock lock(&mu_);
    reading_ = false;
    read_ended_ = true;
    failed_ = true;
    queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
    MaybeFinish();
    return;
  }
  absl::Status taken = take_(&in_);
  absl::MutexLock lock(&mu_);
  if (!taken.ok()) {
    problem_ = std::move(taken);
    reading_ = false;
    failed_ = true;
    context_.TryCancel();
    MaybeFinish();
    return;
  }
  if (answered_) {
    reading_ = false;
    MaybeFinish();
    return;
  }
  call_->Read(&in_, &read_tag_);
}

void ShardCall::OnFinished(bool /*ok*/) {
  if (shape_ == Shape::kOneEachWay && grpc_status_.ok()) {
    // The answer's one message came with the status.
    absl::Status taken = take_(&in_);
    absl::MutexLock lock(&mu_);
    if (!taken.ok() && problem_.ok()) problem_ = std::move(taken);
  }
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = !problem_.ok() ? problem_ : FromGrpcStatus(grpc_status_);
  }
  if (on_end_) on_end_(status);
  absl::MutexLock lock(&mu_);
  status_ = std::move(status);
  done_ = true;
}

bool ShardCall::Sent() {
  absl::MutexLock lock(&mu_);
  return queue_.empty() || failed_;
}

void ShardCall::AnswerComplete() {
  absl::MutexLock lock(&mu_);
  answered_ = true;
}

void ShardCall::Cancel() {
  context_.TryCancel();
  absl::MutexLock lock(&mu_);
  failed_ = true;
  queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
  MaybeFinish();
}

std::optional<absl::Status> ShardCall::Outcome() {
  absl::MutexLock lock(&mu_);
  if (!issued_) {
    return problem_.ok() ? absl::CancelledError("the exchange ended before it was sent") : problem_;
  }
  if (answered_ && problem_.ok()) return absl::OkStatus();
  if (!done_) return std::nullopt;
  return status_;
}

absl::Status ShardCall::Wait() {
  {
    absl::MutexLock lock(&mu_);
    if (!issued_) {  // cancelled, or refused a message, before it was made
      return problem_.ok() ? absl::CancelledError("the exchange ended before it was sent")
                           : problem_;
    }
  }
  driver_->WaitUntil([this] { return Answered(); });
  {
    // A whole answer is a success; the status that follows it says so too.
    absl::MutexLock lock(&mu_);
    if (answered_ && problem_.ok()) return absl::OkStatus();
  }
  driver_->WaitUntil([this] { return Over(); });
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace pst
