#include "ps_server/background_writer.h"

#include <utility>

namespace pst {

BackgroundWriter::BackgroundWriter(std::function<bool(const grpc::ByteBuffer&)> write)
    : write_(std::move(write)) {}

BackgroundWriter::~BackgroundWriter() { Finish(); }

bool BackgroundWriter::Write(grpc::ByteBuffer message) {
  absl::MutexLock lock(&mu_);
  if (failed_) return false;
  queue_.push_back(std::move(message));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  work_.Signal();
  return true;
}

bool BackgroundWriter::Finish() {
  {
    absl::MutexLock lock(&mu_);
    finishing_ = true;
    work_.Signal();
  }
  if (thread_.joinable()) thread_.join();
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
