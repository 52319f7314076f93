// ThreadPool: every task runs, on a thread other than the caller's; idle
// threads are reused; tasks that wait on each other all get a thread; a
// Task's destruction waits for it.
#include "common/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pst {
namespace {

TEST(ThreadPoolTest, RunsTheTaskOnAnotherThreadBeforeWaitReturns) {
  ThreadPool pool;
  std::thread::id ran_on;
  ThreadPool::Task task = pool.Start([&] { ran_on = std::this_thread::get_id(); });
  task.Wait();
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(ThreadPoolTest, ReusesAnIdleThread) {
  ThreadPool pool;
  std::set<std::thread::id> ran_on;
  for (int i = 0; i < 20; ++i) {
    pool.Start([&] { ran_on.insert(std::this_thread::get_id()); }).Wait();
  }
  EXPECT_EQ(pool.threads(), 1);
  EXPECT_EQ(ran_on.size(), 1u);
}

TEST(ThreadPoolTest, TasksRunningAtOnceEachGetAThread) {
  // Each task waits until all have started: with fewer threads than tasks
  // this would never end (bounded here, so a failure does not hang).
  constexpr int kTasks = 6;
  ThreadPool pool;
  absl::Mutex mu;
  absl::CondVar one_started;
  int started = 0;
  std::atomic<int> saw_all{0};
  std::vector<ThreadPool::Task> tasks;
  for (int i = 0; i < kTasks; ++i) {
    tasks.push_back(pool.Start([&] {
      absl::MutexLock lock(&mu);
      ++started;
      one_started.SignalAll();
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (started < kTasks && !one_started.WaitWithDeadline(&mu, deadline)) {
      }
      if (started == kTasks) ++saw_all;
    }));
  }
  for (ThreadPool::Task& task : tasks) task.Wait();
  EXPECT_EQ(saw_all.load(), kTasks);
  EXPECT_EQ(pool.threads(), kTasks);
}

TEST(ThreadPoolTest, ATaskMayStartAnother) {
  ThreadPool pool;
  bool inner_ran = false;
  pool.Start([&] { pool.Start([&] { inner_ran = true; }).Wait(); }).Wait();
  EXPECT_TRUE(inner_ran);
}

TEST(ThreadPoolTest, DestroyingATaskWaitsForIt) {
  ThreadPool pool;
  absl::Notification release;
  std::atomic<bool> finished{false};
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(50));
    release.Notify();
  });
  {
    ThreadPool::Task task = pool.Start([&] {
      release.WaitForNotification();
      finished = true;
    });
  }
  EXPECT_TRUE(finished.load());
  releaser.join();
}

TEST(ThreadPoolTest, AssigningATaskWaitsForTheOneItHeld) {
  ThreadPool pool;
  std::atomic<bool> first_finished{false};
  ThreadPool::Task task = pool.Start([&] {
    absl::SleepFor(absl::Milliseconds(20));
    first_finished = true;
  });
  task = pool.Start([] {});
  EXPECT_TRUE(first_finished.load());
}

}  // namespace
}  // namespace pst
