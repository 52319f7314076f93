#include "rpc/completion_driver.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/alarm.h"
#include "gtest/gtest.h"
#include "rpc/completion_tag.h"

namespace pst {
namespace PST_FILE_ID {

// An event that records where it ran.
class Event final : public CompletionTag {
 public:
  void Complete(bool ok) override {
    thread_ = std::this_thread::get_id();
    ok_ = ok;
    ran_.store(true, std::memory_order_release);
  }
  bool ran() const { return ran_.load(std::memory_order_acquire); }
  std::thread::id thread() const { return thread_; }
  bool ok() const { return ok_; }

 private:
  std::thread::id thread_;
  bool ok_ = false;
  std::atomic<bool> ran_{false};
};

std::chrono::system_clock::time_point Now() { return std::chrono::system_clock::now(); }

TEST(CompletionDriverTest, TheWaitingThreadRunsTheEventItWaitsFor) {
  CompletionDriver driver;
  Event event;
  grpc::Alarm alarm;
  alarm.Set(driver.queue(), Now(), &event);
  EXPECT_TRUE(driver.WaitUntil([&] { return event.ran(); }));
  EXPECT_EQ(event.thread(), std::this_thread::get_id());
  EXPECT_TRUE(event.ok());
}

TEST(CompletionDriverTest, AWaitEndsAtItsDeadlineWhenNothingComes) {
  CompletionDriver driver;
  EXPECT_FALSE(driver.WaitUntil([] { return false; }, absl::Now() + absl::Milliseconds(20)));
}

// Two threads wait for different events at once: one drives, and the other
// returns as soon as its event has run, on whichever thread ran it, or
// drives once the first is done.
TEST(CompletionDriverTest, EveryWaiterReturnsOnceItsEventHasRunWhoeverDrives) {
  for (int round = 0; round < 50; ++round) {
    CompletionDriver driver;
    Event first, second;
    grpc::Alarm first_alarm, second_alarm;
    absl::Notification waiting;
    std::thread other([&] {
      waiting.Notify();
      EXPECT_TRUE(driver.WaitUntil([&] { return second.ran(); }));
    });
    waiting.WaitForNotification();
    second_alarm.Set(driver.queue(), Now(), &second);
    first_alarm.Set(driver.queue(), Now(), &first);
    EXPECT_TRUE(driver.WaitUntil([&] { return first.ran(); }));
    other.join();
    EXPECT_TRUE(second.ran());
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
