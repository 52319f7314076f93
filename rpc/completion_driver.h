// A client's completion queue (rpc/completion_tag.h), driven by the threads
// that wait on its calls: a thread that waits for something the queue's
// events bring takes the events itself, running their tags, until what it
// waits for holds. An answer is so decoded and returned on the thread that
// waits for it, with no hand-off between threads. When several threads
// wait at once, one drives and the others sleep until what they wait for
// holds or the driving passes to them.
#ifndef PST_RPC_COMPLETION_DRIVER_H_
#define PST_RPC_COMPLETION_DRIVER_H_

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/completion_queue.h"

namespace pst {

class CompletionDriver {
 public:
  CompletionDriver() = default;
  // Shuts the queue down and drops what is left in it: every call started
  // on it must be over.
  ~CompletionDriver();
  CompletionDriver(const CompletionDriver&) = delete;
  CompletionDriver& operator=(const CompletionDriver&) = delete;

  grpc::CompletionQueue* queue() { return &queue_; }

  // Runs the queue's events until `done()` holds, or `deadline` passes;
  // returns done(). `done` is checked after every event, and must hold once
  // an event has made it so, on whichever thread ran the event.
  bool WaitUntil(absl::FunctionRef<bool()> done, absl::Time deadline = absl::InfiniteFuture());

 private:
  // Takes one event, waiting until `deadline`; false if none came.
  bool RunOne(absl::Time deadline);

  grpc::CompletionQueue queue_;
  absl::Mutex mu_;
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  // Threads waiting while another drives: after each event the driver
  // lets them look again.
  std::atomic<int> followers_{0};
};

}  // namespace pst

#endif  // PST_RPC_COMPLETION_DRIVER_H_
