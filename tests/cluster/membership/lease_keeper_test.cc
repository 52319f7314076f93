// LeaseKeeper against a fake etcd whose renewals the test controls: no
// server, a 300 ms TTL.
#include "cluster/membership/lease_keeper.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/membership/etcd_client.h"
#include "gtest/gtest.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

constexpr absl::Duration kTtl = absl::Milliseconds(300);

class FakeEtcd final : public EtcdClient {
 public:
  enum class Renewal { kAnswered, kUnreachable, kGone };

  absl::StatusOr<etcdserverpb::RangeResponse> Get(absl::string_view, absl::Time) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest&,
                                                absl::Time) override {
    return absl::UnimplementedError("not in this fake");
  }
  absl::StatusOr<Lease> GrantLease(absl::Duration, absl::Time) override {
    return Lease{.id = 7, .ttl = kTtl};
  }
  absl::Status RevokeLease(int64_t id, absl::Time) override {
    revoked = id;
    return absl::OkStatus();
  }
  absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t, absl::Time) override {
    ++renewals;
    switch (renewal.load()) {
      case Renewal::kAnswered:
        return kTtl;
      case Renewal::kUnreachable:
        return absl::DeadlineExceededError("etcd unreachable until the deadline");
      case Renewal::kGone:
        break;
    }
    return absl::NotFoundError("etcd lease 7 no longer exists");
  }
  absl::StatusOr<std::vector<mvccpb::Event>> AwaitEvents(absl::string_view, int64_t,
                                                         absl::Time) override {
    return absl::UnimplementedError("not in this fake");
  }

  std::atomic<Renewal> renewal{Renewal::kAnswered};
  std::atomic<int> renewals{0};
  std::atomic<int64_t> revoked{0};
};

// What the keeper's callback reported. The callback runs after the loss is
// recorded (status() and AwaitLost see it first): a test waits for `lost`.
struct LossLog {
  absl::Mutex mu;
  std::vector<absl::Status> losses ABSL_GUARDED_BY(mu);
  absl::Time first_at ABSL_GUARDED_BY(mu);
  absl::Notification lost;

  LeaseKeeper::LostCallback Callback() {
    return [this](const absl::Status& status) {
      absl::MutexLock lock(&mu);
      if (losses.empty()) first_at = absl::Now();
      losses.push_back(status);
      if (!lost.HasBeenNotified()) lost.Notify();
    };
  }
};

std::unique_ptr<LeaseKeeper> Grant(FakeEtcd* etcd, LossLog* log) {
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper =
      LeaseKeeper::Grant(etcd, kTtl, absl::Now() + absl::Seconds(1), log->Callback());
  EXPECT_TRUE(keeper.ok()) << keeper.status();
  return keeper.ok() ? *std::move(keeper) : nullptr;
}

TEST(LeaseKeeperTest, RenewalsKeepTheLeaseSurelyAlive) {
  FakeEtcd etcd;
  LossLog log;
  auto keeper = Grant(&etcd, &log);
  EXPECT_EQ(keeper->id(), 7);
  EXPECT_EQ(keeper->ttl(), kTtl);
  // Three TTLs' worth of renewals: the lease outlives its first TTL.
  ASSERT_TRUE(Eventually([&] { return etcd.renewals >= 9; }));
  EXPECT_TRUE(keeper->status().ok()) << keeper->status();
  EXPECT_GT(keeper->SureUntil(), absl::Now());
  EXPECT_FALSE(keeper->AwaitLost(absl::Now() + absl::Milliseconds(50)));
  absl::MutexLock lock(&log.mu);
  EXPECT_TRUE(log.losses.empty());
}

TEST(LeaseKeeperTest, UnansweredRenewalsLoseTheLeaseWhenItMayHaveLapsed) {
  FakeEtcd etcd;
  LossLog log;
  auto keeper = Grant(&etcd, &log);
  ASSERT_TRUE(Eventually([&] { return etcd.renewals >= 1; }));
  etcd.renewal = FakeEtcd::Renewal::kUnreachable;
  const int renewals = etcd.renewals;
  ASSERT_TRUE(Eventually([&] { return etcd.renewals > renewals; }));
  // No renewal is answered from here on: the lease is lost at SureUntil.
  const absl::Time sure_until = keeper->SureUntil();
  ASSERT_TRUE(keeper->AwaitLost(absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(keeper->status().code(), absl::StatusCode::kUnavailable) << keeper->status();
  EXPECT_EQ(keeper->SureUntil(), sure_until);
  // Answers coming back change nothing: a loss is final.
  etcd.renewal = FakeEtcd::Renewal::kAnswered;
  EXPECT_EQ(keeper->status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(log.lost.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.losses.size(), 1u);
  EXPECT_EQ(log.losses[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_GE(log.first_at, sure_until);
  EXPECT_LT(log.first_at - sure_until, absl::Milliseconds(200));
}

TEST(LeaseKeeperTest, ALeaseEtcdNoLongerHasIsLostAtOnce) {
  FakeEtcd etcd;
  LossLog log;
  auto keeper = Grant(&etcd, &log);
  etcd.renewal = FakeEtcd::Renewal::kGone;
  ASSERT_TRUE(keeper->AwaitLost(absl::Now() + absl::Seconds(5)));
  EXPECT_EQ(keeper->status().code(), absl::StatusCode::kNotFound) << keeper->status();
  ASSERT_TRUE(log.lost.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.losses.size(), 1u);
  EXPECT_EQ(log.losses[0].code(), absl::StatusCode::kNotFound);
}

TEST(LeaseKeeperTest, StoppingOrRevokingIsNoLoss) {
  FakeEtcd etcd;
  LossLog log;
  auto stopped = Grant(&etcd, &log);
  stopped->Stop();
  EXPECT_EQ(stopped->status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(stopped->AwaitLost(absl::Now()));
  EXPECT_EQ(etcd.revoked, 0);

  auto revoked = Grant(&etcd, &log);
  ASSERT_TRUE(revoked->Revoke(absl::Now() + absl::Seconds(1)).ok());
  EXPECT_EQ(etcd.revoked, 7);
  EXPECT_EQ(revoked->status().code(), absl::StatusCode::kCancelled);
  absl::MutexLock lock(&log.mu);
  EXPECT_TRUE(log.losses.empty());
}

}  // namespace PST_FILE_ID
}  // namespace pst
