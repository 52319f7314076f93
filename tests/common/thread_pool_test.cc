// ThreadPool: every task runs, on a thread other than the caller's; idle
// threads are reused; tasks that wait on each other all get a thread; a
// Task's destruction waits for it.
#include "common/thread_pool.h"

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

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

// The task runs until the releaser lets it go, and the releaser does so only
// once the call that must wait for the task has been made and has not
// returned for a while. A call that returned without waiting is caught
// twice: it returns before the task finished, and the releaser sees it
// return.
class TaskWaitTest : public ::testing::Test {
 protected:
  // Starts the task that `call` must wait for.
  ThreadPool::Task StartHeldTask() {
    return pool_.Start([this] {
      release_.WaitForNotification();
      finished_ = true;
    });
  }

  // Makes `call`, which must return only once the held task has finished.
  template <typename Call>
  void ExpectWaits(Call call) {
    std::thread releaser([this] {
      calling_.WaitForNotification();
      EXPECT_FALSE(returned_.WaitForNotificationWithTimeout(absl::Milliseconds(100)))
          << "returned while the task still ran";
      release_.Notify();
    });
    calling_.Notify();
    call();
    const bool finished_on_return = finished_.load();
    returned_.Notify();
    EXPECT_TRUE(finished_on_return);
    releaser.join();
  }

  absl::Notification calling_, returned_, release_;
  std::atomic<bool> finished_{false};
  ThreadPool pool_;  // last: its threads are joined before the rest goes
};

TEST_F(TaskWaitTest, DestroyingATaskWaitsForIt) {
  auto task = std::make_unique<ThreadPool::Task>(StartHeldTask());
  ExpectWaits([&] { task.reset(); });
}

TEST_F(TaskWaitTest, AssigningATaskWaitsForTheOneItHeld) {
  ThreadPool::Task task = StartHeldTask();
  ExpectWaits([&] { task = pool_.Start([] {}); });
}

}  // namespace PST_FILE_ID
}  // namespace pst
