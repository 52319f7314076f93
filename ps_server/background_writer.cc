#include "ps_server/background_writer.h"

#include <utility>

namespace pst {

BackgroundWriter::BackgroundWriter(std::function<bool(const grpc::ByteBuffer&)> write,
                                   ThreadPool* threads)
    : write_(std::move(write)), threads_(threads) {}

BackgroundWriter::~BackgroundWriter() { Finish(); }

bool BackgroundWriter::Write(grpc::ByteBuffer message) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
    queue_.push_back(std::move(message));
    work_.Signal();
  }
  if (!started_) {
    started_ = true;
    writing_ = threads_->Start([this] { Run(); });
  }
  return true;
}

bool BackgroundWriter::Finish() {
  {
    absl::MutexLock lock(&mu_);
    finishing_ = true;
    work_.Signal();
  }
  writing_.Wait();
  absl::MutexLock lock(&mu_);
  return !failed_;
}

void BackgroundWriter::Run() {
  while (true) {
    grpc::ByteBuffer message;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && !finishing_) work_.Wait(&mu_);
      if (queue_.empty()) return;  // finishing, and all written
      message = std::move(queue_.front());
      queue_.pop_front();
      if (failed_) continue;  // dropped: the call has ended
    }
    // Outside the lock: the write may block until the peer reads.
    if (!write_(message)) {
      absl::MutexLock lock(&mu_);
      failed_ = true;
    }
  }
}

}  // namespace pst
