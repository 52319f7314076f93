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
  return true;
}

bool BackgroundWriter::Finish() {
  {
    absl::MutexLock lock(&mu_);
    finishing_ = true;
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
      const auto has_work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || finishing_;
      };
      mu_.Await(absl::Condition(&has_work));
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
