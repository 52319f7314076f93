#include "common/thread_pool.h"

#include <utility>

namespace pst {

struct ThreadPool::TaskState {
  absl::Mutex mu;
  absl::CondVar ran;
  bool done ABSL_GUARDED_BY(mu) = false;
};

ThreadPool::Task& ThreadPool::Task::operator=(Task&& other) {
  if (this != &other) {
    Wait();
    state_ = std::move(other.state_);
  }
  return *this;
}

void ThreadPool::Task::Wait() {
  if (state_ == nullptr) return;
  {
    absl::MutexLock lock(&state_->mu);
    while (!state_->done) state_->ran.Wait(&state_->mu);
  }
  state_.reset();
}

ThreadPool::~ThreadPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

ThreadPool::Task ThreadPool::Start(absl::AnyInvocable<void() &&> task) {
  auto state = std::make_shared<TaskState>();
  Enqueue(std::move(task), state);
  return Task(std::move(state));
}

void ThreadPool::Post(absl::AnyInvocable<void() &&> task) { Enqueue(std::move(task), nullptr); }

void ThreadPool::Enqueue(absl::AnyInvocable<void() &&> task, std::shared_ptr<TaskState> state) {
  absl::MutexLock lock(&mu_);
  queue_.push_back({std::move(task), state});
  // Idle threads not yet woken count against the tasks queued before this
  // one: a new thread is made unless one is left over for this task.
  if (static_cast<int>(queue_.size()) > idle_ &&
      static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Serve(); });
  } else {
    work_.Signal();
  }
}

int ThreadPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void ThreadPool::Serve() {
  std::shared_ptr<TaskState> ran;  // the task this thread last ran
  while (true) {
    Queued next;
    {
      absl::MutexLock lock(&mu_);
      // Idle before its waiter hears the task has run: a caller that starts
      // its next task at once then gets this thread, not a new one.
      ++idle_;
      if (ran != nullptr) {
        absl::MutexLock done(&ran->mu);
        ran->done = true;
        ran->ran.SignalAll();
        ran.reset();
      }
      while (queue_.empty() && !stopping_) work_.Wait(&mu_);
      --idle_;
      if (queue_.empty()) return;  // stopping, and every task has run
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(next.task)();
    next.task = nullptr;  // what it captured goes before the waiter is told
    ran = std::move(next.state);
  }
}

}  // namespace pst
