// ShardMembership against a real etcd per test: election, epochs as fencing
// tokens, failover on a lapsed lease within its bound, the replica chain,
// and an etcd that goes away and comes back.
#include "cluster/membership/shard_membership.h"

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cluster/membership/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/membership/etcd_server.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;

constexpr absl::Duration kTtl = absl::Seconds(1);
// The bound on a failover: from the moment the old primary's lease surely
// ran out to the moment its successor is elected. etcd looks for expired
// leases every 500 ms; the rest is a revocation, a watch event and a
// campaign's three writes.
constexpr absl::Duration kFailoverBound = absl::Milliseconds(1500);

absl::Time In(absl::Duration d) { return absl::Now() + d; }

class ShardMembershipTest : public EtcdTest {
 protected:
  // A client of its own per member, as each would be in its own process.
  std::unique_ptr<ShardMembership> Member(int shard = 0,
                                          LeaseKeeper::LostCallback on_lost = nullptr) {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect({etcd_->endpoint()});
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    clients_.push_back(*std::move(client));
    absl::StatusOr<std::unique_ptr<ShardMembership>> member =
        ShardMembership::Create(clients_.back().get(), "job1", shard, std::move(on_lost));
    EXPECT_TRUE(member.ok()) << member.status();
    return member.ok() ? *std::move(member) : nullptr;
  }

  std::vector<std::unique_ptr<EtcdClient>> clients_;  // outlive the members below them
};

TEST_F(ShardMembershipTest, OneCampaignerWinsAndTheOtherSeesItsEpoch) {
  auto a = Member(), b = Member();
  absl::StatusOr<CampaignResult> won = a->Campaign("10.0.0.1:7000", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(won->elected);
  EXPECT_EQ(won->primary, (ShardPrimary{.address = "10.0.0.1:7000", .epoch = 1}));
  EXPECT_EQ(a->elected(), won->primary);
  EXPECT_TRUE(a->office_status().ok());
  EXPECT_GT(a->SurelyPrimaryUntil(), absl::Now());

  absl::StatusOr<CampaignResult> lost = b->Campaign("10.0.0.2:7000", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_FALSE(lost->elected);
  EXPECT_EQ(lost->primary, won->primary);
  EXPECT_EQ(b->elected(), std::nullopt);
  EXPECT_EQ(b->SurelyPrimaryUntil(), absl::InfinitePast());

  absl::StatusOr<PrimaryView> view = b->Current(In(absl::Seconds(10)));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->primary, won->primary);
  EXPECT_GT(view->revision, 0);

  // Another shard of the job is another office, with epochs of its own.
  auto other_shard = Member(/*shard=*/1);
  absl::StatusOr<CampaignResult> other =
      other_shard->Campaign("10.0.0.2:7000", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(other->elected);
  EXPECT_EQ(other->primary.epoch, 1);
}

TEST_F(ShardMembershipTest, APrimaryCampaignsAgainOnlyAfterLeavingOffice) {
  auto a = Member();
  ASSERT_TRUE(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).ok());
  EXPECT_EQ(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a->Resign(In(absl::Seconds(10))).ok());
  EXPECT_EQ(a->elected(), std::nullopt);
  EXPECT_TRUE(a->AwaitOfficeLost(absl::Now()));
  absl::StatusOr<CampaignResult> again = a->Campaign("a:1", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->elected);
  EXPECT_EQ(again->primary.epoch, 2);  // the epoch outlives the office
}

TEST_F(ShardMembershipTest, ResignationDeletesThePrimaryKeyAtOnce) {
  auto a = Member(), b = Member();
  ASSERT_TRUE(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).ok());
  absl::StatusOr<PrimaryView> seen = b->Current(In(absl::Seconds(10)));
  ASSERT_TRUE(seen.ok()) << seen.status();
  ASSERT_TRUE(seen->primary.has_value());

  ASSERT_TRUE(a->Resign(In(absl::Seconds(10))).ok());
  absl::StatusOr<PrimaryView> changed = b->AwaitChange(*seen, In(absl::Seconds(10)));
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(changed->primary, std::nullopt);
  EXPECT_GT(changed->revision, seen->revision);

  absl::StatusOr<CampaignResult> won = b->Campaign("b:1", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(won->elected);
  EXPECT_EQ(won->primary.epoch, 2);
}

TEST_F(ShardMembershipTest, AwaitChangeEndsAtItsDeadlineWhenNothingChanges) {
  auto a = Member(), b = Member();
  ASSERT_TRUE(a->Campaign("a:1", absl::Seconds(5), In(absl::Seconds(10))).ok());
  absl::StatusOr<PrimaryView> seen = b->Current(In(absl::Seconds(10)));
  ASSERT_TRUE(seen.ok()) << seen.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<PrimaryView> changed = b->AwaitChange(*seen, start + absl::Milliseconds(300));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kDeadlineExceeded) << changed.status();
  EXPECT_GE(waited, absl::Milliseconds(250));
  EXPECT_LT(waited, absl::Seconds(2));
}

TEST_F(ShardMembershipTest, ABackupTakesOverWithinTheBoundOnceTheLeaseLapses) {
  auto a = Member(), b = Member();
  ASSERT_TRUE(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).ok());
  absl::StatusOr<CampaignResult> first = b->Campaign("b:1", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->elected);

  // The primary stops renewing, as a crashed process would.
  const absl::Time lease_runs_out = a->Abandon();
  absl::StatusOr<CampaignResult> won = b->CampaignUntilElected("b:1", kTtl, In(absl::Seconds(10)));
  const absl::Duration failover = absl::Now() - lease_runs_out;
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(won->elected);
  EXPECT_EQ(won->primary, (ShardPrimary{.address = "b:1", .epoch = 2}));
  EXPECT_LE(failover, kFailoverBound);
  RecordProperty("failover_ms", absl::StrCat(absl::ToInt64Milliseconds(failover)));
  std::printf("failover: elected %s after the lease ran out\n",
              absl::FormatDuration(failover).c_str());
}

TEST_F(ShardMembershipTest, EpochsStrictlyIncreaseOverFiveFailovers) {
  std::vector<std::unique_ptr<ShardMembership>> members;
  members.push_back(Member());
  absl::StatusOr<CampaignResult> first =
      members.back()->Campaign("r0:1", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<int64_t> epochs = {first->primary.epoch};
  for (int i = 1; i <= 5; ++i) {
    SCOPED_TRACE(absl::StrCat("failover ", i));
    ShardMembership& old_primary = *members.back();
    members.push_back(Member());
    ShardMembership& backup = *members.back();
    // Half the primaries resign; the others lapse.
    absl::Time lease_runs_out = absl::Now();
    if (i % 2 == 1) {
      ASSERT_TRUE(old_primary.Resign(In(absl::Seconds(10))).ok());
    } else {
      lease_runs_out = old_primary.Abandon();
    }
    absl::StatusOr<CampaignResult> won =
        backup.CampaignUntilElected(absl::StrCat("r", i, ":1"), kTtl, In(absl::Seconds(10)));
    const absl::Duration failover = absl::Now() - lease_runs_out;
    ASSERT_TRUE(won.ok()) << won.status();
    ASSERT_TRUE(won->elected);
    EXPECT_LE(failover, kFailoverBound);
    std::printf("failover %d (%s): %s\n", i, i % 2 == 1 ? "resigned" : "lapsed",
                absl::FormatDuration(failover).c_str());
    epochs.push_back(won->primary.epoch);
  }
  EXPECT_THAT(epochs, ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST_F(ShardMembershipTest, OnlyThePrimaryInOfficeWritesTheChain) {
  auto a = Member(), b = Member();
  EXPECT_EQ(b->ReadChain(In(absl::Seconds(10))).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).ok());
  ASSERT_TRUE(a->PublishChain({"a:1", "b:1", "c:1"}, In(absl::Seconds(10))).ok());
  EXPECT_EQ(b->PublishChain({"b:1"}, In(absl::Seconds(10))).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->PublishChain({"a:1", "b 1"}, In(absl::Seconds(10))).code(),
            absl::StatusCode::kInvalidArgument);

  absl::StatusOr<ReplicaChain> chain = b->ReadChain(In(absl::Seconds(10)));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->epoch, 1);
  EXPECT_THAT(chain->replicas, ElementsAre("a:1", "b:1", "c:1"));

  // The successor's chain replaces it, under the successor's epoch; the
  // deposed primary writes no more.
  a->Abandon();
  absl::StatusOr<CampaignResult> won = b->CampaignUntilElected("b:1", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(won.ok()) << won.status();
  ASSERT_TRUE(b->PublishChain({"b:1", "c:1"}, In(absl::Seconds(10))).ok());
  EXPECT_EQ(a->PublishChain({"a:1"}, In(absl::Seconds(10))).code(),
            absl::StatusCode::kFailedPrecondition);
  chain = a->ReadChain(In(absl::Seconds(10)));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->epoch, 2);
  EXPECT_THAT(chain->replicas, ElementsAre("b:1", "c:1"));
}

TEST_F(ShardMembershipTest, AnUnreachableEtcdFailsCallsByTheirDeadlineAndTheLeaseIsReportedLost) {
  absl::Mutex mu;
  absl::Status lost_status;
  absl::Time lost_at;
  absl::Notification lost;
  auto a = Member(0, [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    lost_status = status;
    lost_at = absl::Now();
    lost.Notify();
  });
  ASSERT_TRUE(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).ok());

  etcd_->Kill();
  const absl::Time killed = absl::Now();
  // The holder learns by the time the lease may have lapsed.
  ASSERT_TRUE(a->AwaitOfficeLost(In(absl::Seconds(5))));
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(1)));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(lost_status.code(), absl::StatusCode::kUnavailable) << lost_status;
    EXPECT_LE(lost_at - killed, kTtl + absl::Milliseconds(300));
  }
  EXPECT_EQ(a->office_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a->elected(), std::nullopt);
  EXPECT_EQ(a->SurelyPrimaryUntil(), absl::InfinitePast());

  // Every call returns by its deadline.
  auto b = Member();
  struct Call {
    const char* name;
    std::function<absl::Status(absl::Time)> run;
  };
  const std::vector<Call> calls = {
      {"Current", [&](absl::Time d) { return b->Current(d).status(); }},
      {"Campaign", [&](absl::Time d) { return b->Campaign("b:1", kTtl, d).status(); }},
      {"AwaitChange", [&](absl::Time d) { return b->AwaitChange(PrimaryView{}, d).status(); }},
      {"ReadChain", [&](absl::Time d) { return b->ReadChain(d).status(); }},
      // The lost lease may live on in etcd: resigning still tries to revoke it.
      {"Resign", [&](absl::Time d) { return a->Resign(d); }},
  };
  for (const Call& call : calls) {
    SCOPED_TRACE(call.name);
    const absl::Time start = absl::Now();
    const absl::Status status = call.run(start + absl::Milliseconds(300));
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_LT(took, absl::Milliseconds(800));
  }
}

TEST_F(ShardMembershipTest, CampaignsWorkAgainOnceEtcdRestartsOnItsData) {
  auto a = Member();
  ASSERT_TRUE(a->Campaign("a:1", kTtl, In(absl::Seconds(10))).ok());
  ASSERT_TRUE(a->PublishChain({"a:1", "b:1"}, In(absl::Seconds(10))).ok());
  etcd_->Kill();
  ASSERT_TRUE(a->AwaitOfficeLost(In(absl::Seconds(5))));

  ASSERT_TRUE(etcd_->Restart().ok());
  // etcd restores a's lease with a fresh TTL; nobody renews it, so it lapses.
  auto b = Member();
  absl::StatusOr<CampaignResult> won = b->CampaignUntilElected("b:1", kTtl, In(absl::Seconds(10)));
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(won->elected);
  EXPECT_EQ(won->primary.epoch, 2);  // the epoch key survived the restart
  absl::StatusOr<ReplicaChain> chain = b->ReadChain(In(absl::Seconds(10)));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->epoch, 1);  // the last chain written, by epoch 1

  // The old client reconnects too.
  absl::StatusOr<PrimaryView> view = a->Current(In(absl::Seconds(10)));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->primary, won->primary);
}

TEST(ShardMembershipArgumentsTest, BadNamesAreRefusedBeforeAnyCall) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect({"127.0.0.1:1"});
  ASSERT_TRUE(client.ok()) << client.status();
  for (const char* job : {"", "a/b", "a b", "a,b"}) {
    SCOPED_TRACE(job);
    EXPECT_EQ(ShardMembership::Create(client->get(), job, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(ShardMembership::Create(client->get(), "job", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<ShardMembership>> member =
      ShardMembership::Create(client->get(), "job", 3);
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_EQ((*member)->primary_key(), "/pstrain/job/shard/3/primary");
  for (const char* address : {"", "a b:1", "a:1,b:1"}) {
    SCOPED_TRACE(address);
    EXPECT_EQ((*member)->Campaign(address, kTtl, In(absl::Seconds(1))).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
