// Threads kept for reuse: runs each task on an idle thread of the pool, or
// on a new one when every thread is busy.
//
// A few short tasks run beside the calls: a worker makes its control calls
// to shards 1..N-1 while the calling thread makes shard 0's, and a PS
// answers a pull once its wait is over, or applies a push that waited for
// its turn, off gRPC's completion-queue threads. Creating and joining a thread for
// each costs about as much as a small round trip itself, while a kept
// thread is woken in a few microseconds.
//
// The pool grows to the most tasks that ever ran at once (or to its bound,
// if it has one) and keeps those threads until it is destroyed.
#ifndef PST_COMMON_THREAD_POOL_H_
#define PST_COMMON_THREAD_POOL_H_

#include <deque>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace pst {

class ThreadPool {
 private:
  struct TaskState;

 public:
  // One started task. Wait() returns once it has run; so does the
  // destructor, so a task may use its caller's locals.
  class Task {
   public:
    Task() = default;
    Task(Task&&) = default;
    Task& operator=(Task&& other);
    ~Task() { Wait(); }

    void Wait();

   private:
    friend class ThreadPool;
    explicit Task(std::shared_ptr<TaskState> state) : state_(std::move(state)) {}
    std::shared_ptr<TaskState> state_;  // null: no task, or waited for
  };

  ThreadPool() = default;
  // A pool of at most `max_threads` threads: beyond that, a task waits in
  // the queue for a thread to be free. For tasks that never wait on each
  // other.
  explicit ThreadPool(int max_threads) : max_threads_(max_threads) {}
  // Runs the tasks still queued, then joins every thread.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Starts `task` at once, on a thread of its own. May be called from any
  // thread, tasks included.
  Task Start(absl::AnyInvocable<void() &&> task);
  // Starts `task` as Start does, with nobody to wait for it: for work
  // handed off by code that must not block (a completion-queue event's). The
  // pool's destructor still runs it.
  void Post(absl::AnyInvocable<void() &&> task);

  // Threads the pool has made (busy or idle).
  int threads() const;

 private:
  struct Queued {
    absl::AnyInvocable<void() &&> task;
    std::shared_ptr<TaskState> state;
  };

  void Enqueue(absl::AnyInvocable<void() &&> task, std::shared_ptr<TaskState> state);
  void Serve();

  const int max_threads_ = std::numeric_limits<int>::max();
  mutable absl::Mutex mu_;
  // Signalled when a task is queued or the pool is being destroyed. (A
  // CondVar, not Mutex::Await: absl evaluates an Await condition on whichever
  // thread unlocks, which the TSan build's annotations cannot order.)
  absl::CondVar work_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pst

#endif  // PST_COMMON_THREAD_POOL_H_
