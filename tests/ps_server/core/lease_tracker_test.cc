// Worker leases on the tracker's own timer, driven by a manual clock: a lease
// runs out when the clock passes it, whether or not anyone calls in, and
// not a moment before.
#include "ps_server/core/lease_tracker.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kLease = absl::Seconds(5);

// A tracker of `workers` workers whose reports land in `expired`.
class LeaseTrackerTest : public ::testing::Test {
 protected:
  explicit LeaseTrackerTest(int workers = 3)
      : tracker_(
            workers, kLease, &mu_,
            [this](const std::vector<int>& workers) {
              mu_.AssertHeld();
              for (int w : workers) expired_.push_back(w);
            },
            clock_) {}

  // Moves the clock on and returns once the tracker has looked at the new
  // time (and gone back to sleep).
  void Advance(absl::Duration by) {
    clock_.Advance(by);
    ASSERT_TRUE(Eventually([&] { return clock_.sleepers() == 1; }))
        << "the tracker never went back to sleep";
  }
  std::vector<int> Expired() {
    absl::MutexLock lock(&mu_);
    return expired_;
  }
  LeaseTracker::Heard Touch(int worker) {
    absl::MutexLock lock(&mu_);
    return tracker_.Touch(worker);
  }
  bool Live(int worker) {
    absl::MutexLock lock(&mu_);
    return tracker_.live(worker);
  }

  ManualLeaseClock clock_;
  absl::Mutex mu_;
  std::vector<int> expired_ ABSL_GUARDED_BY(mu_);
  LeaseTracker tracker_;
};

TEST_F(LeaseTrackerTest, ASilentWorkerExpiresWhenItsLeaseRunsOutAndNotBefore) {
  EXPECT_EQ(Touch(1), LeaseTracker::Heard::kFirstTime);
  Advance(kLease - absl::Milliseconds(1));
  EXPECT_THAT(Expired(), IsEmpty());
  EXPECT_TRUE(Live(1));
  Advance(absl::Milliseconds(1));
  EXPECT_THAT(Expired(), ElementsAre(1));
  EXPECT_FALSE(Live(1));
  // Reported once: more time changes nothing.
  Advance(kLease * 10);
  EXPECT_THAT(Expired(), ElementsAre(1));
}

TEST_F(LeaseTrackerTest, AWorkerNeverHeardFromNeverExpires) {
  Advance(kLease * 100);
  EXPECT_THAT(Expired(), IsEmpty());
  EXPECT_TRUE(Live(0));
}

TEST_F(LeaseTrackerTest, HearingFromAWorkerRenewsItsLease) {
  Touch(0);
  Touch(2);
  Advance(kLease / 2);
  EXPECT_EQ(Touch(0), LeaseTracker::Heard::kAgain);
  Advance(kLease / 2);  // worker 2's lease has run out, worker 0's has not
  EXPECT_THAT(Expired(), ElementsAre(2));
  Advance(kLease / 2);
  EXPECT_THAT(Expired(), ElementsAre(2, 0));
}

TEST_F(LeaseTrackerTest, ACallInFlightHoldsTheLeaseWhichRunsFromTheCallsEnd) {
  {
    absl::MutexLock lock(&mu_);
    tracker_.Touch(1);
    tracker_.BeginCall(1);
  }
  Advance(kLease * 3);
  EXPECT_THAT(Expired(), IsEmpty());
  {
    absl::MutexLock lock(&mu_);
    tracker_.EndCall(1);
  }
  Advance(kLease - absl::Milliseconds(1));
  EXPECT_THAT(Expired(), IsEmpty());
  Advance(absl::Milliseconds(1));
  EXPECT_THAT(Expired(), ElementsAre(1));
}

TEST_F(LeaseTrackerTest, AnExpiredWorkerThatCallsInIsBack) {
  Touch(0);
  Advance(kLease);
  ASSERT_THAT(Expired(), ElementsAre(0));
  EXPECT_EQ(Touch(0), LeaseTracker::Heard::kBack);
  EXPECT_TRUE(Live(0));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(tracker_.SinceSeen(0), absl::ZeroDuration());
    EXPECT_EQ(tracker_.SinceSeen(1), std::nullopt);
  }
  // Its new lease runs out in its turn.
  Advance(kLease);
  EXPECT_THAT(Expired(), ElementsAre(0, 0));
}

}  // namespace PST_FILE_ID
}  // namespace pst
