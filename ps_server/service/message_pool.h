// A free list of protobuf messages, so that the buffers of large requests
// and responses are reused from call to call instead of allocated (and, for
// large ones, page-faulted in) anew. Messages come back as their last user
// left them, not cleared: a taker overwrites every field it uses, and a
// payload string of the size it needs is then written in place, neither
// reallocated nor zero-filled first. At most `max_kept` messages are kept;
// one given back beyond that is freed. Thread-safe.
#ifndef PST_PS_SERVER_SERVICE_MESSAGE_POOL_H_
#define PST_PS_SERVER_SERVICE_MESSAGE_POOL_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pst {

template <typename Message>
class MessagePool {
 public:
  explicit MessagePool(size_t max_kept) : max_kept_(max_kept) {}

  // A reused message when any is free (as its last user left it), else a new one.
  std::unique_ptr<Message> Take() {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) return std::make_unique<Message>();
    std::unique_ptr<Message> message = std::move(free_.back());
    free_.pop_back();
    return message;
  }

  // Returns `message` for reuse; false if the pool was full and it was
  // freed instead.
  bool Give(std::unique_ptr<Message> message) {
    {
      absl::MutexLock lock(&mu_);
      if (free_.size() < max_kept_) {
        free_.push_back(std::move(message));
        return true;
      }
    }
    message.reset();  // outside the lock: a large message takes a while to free
    return false;
  }

 private:
  const size_t max_kept_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Message>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_MESSAGE_POOL_H_
