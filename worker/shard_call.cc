#include "worker/shard_call.h"

#include "rpc/chunk_wire.h"
#include "rpc/grpc_status.h"

namespace pst {

namespace {
// Set by a stub's PrepareCall: the call's method.
const std::string& ExchangeMethod() {
  static const std::string* const method = new std::string(kExchangeMethod);
  return *method;
}
}  // namespace

ShardCall::ShardCall(grpc::GenericStub* stub, CompletionDriver* driver, absl::Duration deadline,
                     TakeAnswer take, OnEnd on_end)
    : driver_(driver), take_(std::move(take)), on_end_(std::move(on_end)) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  // The call's headers go with its first message: one frame fewer for an
  // exchange of one message each way.
  context_.set_initial_metadata_corked(true);
  call_ = stub->PrepareCall(&context_, ExchangeMethod(), driver_->queue());
}

ShardCall::~ShardCall() {
  bool started = false;
  {
    absl::MutexLock lock(&mu_);
    started = started_;
  }
  if (!started) return;  // gRPC drops a call never started with its context
  if (!Over()) Cancel();
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
    reading_ = true;
  }
  // With the headers corked, StartCall only queues them for the first
  // write: its tag never comes back.
  call_->StartCall(nullptr);
  call_->Read(&in_, &read_tag_);
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
    call_->WriteLast(next->message, grpc::WriteOptions(), &write_tag_);
  } else {
    call_->Write(next->message, &write_tag_);
  }
}

void ShardCall::MaybeFinish() {
  if (!started_ || finishing_ || reading_ || writing_) return;
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

absl::Status ShardCall::Wait() {
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
