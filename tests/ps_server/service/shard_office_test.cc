// A shard's membership in a real etcd (ShardOffice): a new job's replica 0
// takes office and publishes its first chain once its backup holds its
// state (lost before that, replica 0 takes the office again), a
// backup of the chain takes over from a primary that leaves, and a backup
// dropped from the chain (published first) never does; a backup that a
// worker asked for the primary deposes one that does not answer, and a
// replica restarted at its address deposes the office its dead process held.
#include "ps_server/service/shard_office.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster/membership/etcd_server.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)
using replica_testing::AsReplica;
using replica_testing::Forward;
using ::testing::ElementsAre;

constexpr char kJob[] = "office-test";

class ShardOfficeTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    for (int replica = 0; replica < 2; ++replica) shards_.push_back(MakeReplica(replica));
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect({etcd_->endpoint()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    absl::StatusOr<std::unique_ptr<ShardMembership>> membership =
        ShardMembership::Create(client_.get(), kJob, 0);
    ASSERT_TRUE(membership.ok()) << membership.status();
    membership_ = *std::move(membership);
  }

  // Replica `replica` as its process starts, holding nothing.
  static std::unique_ptr<ParameterShard> MakeReplica(int replica) {
    ShardOptions options = AsReplica(Options(ASYNC, 1), replica);
    options.elected = true;
    return MakeShard(options);
  }

  std::unique_ptr<ShardOffice> StartOffice(
      int replica, absl::Duration lease = absl::Seconds(1),
      std::function<bool(const ShardPrimary&)> primary_answers = nullptr) {
    absl::StatusOr<std::unique_ptr<ShardOffice>> office = ShardOffice::Start(
        shards_[replica].get(), {.etcd_endpoints = {etcd_->endpoint()},
                                 .job = kJob,
                                 .address = absl::StrCat("127.0.0.1:", 7000 + replica),
                                 .lease = lease,
                                 .restored = false,
                                 .primary_answers = std::move(primary_answers)});
    EXPECT_TRUE(office.ok()) << office.status();
    return office.ok() ? *std::move(office) : nullptr;
  }

  // Whether replica `replica` is primary within `timeout`: its shard is
  // the event (it takes office on the office's thread).
  bool AwaitPrimary(int replica, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!shards_[replica]->primary()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  // The chain as etcd holds it once it has `size` replicas (or after `timeout`).
  std::vector<std::string> AwaitChain(size_t size, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> replicas;
    while (absl::Now() < deadline) {
      absl::StatusOr<ReplicaChain> chain = membership_->ReadChain(absl::Now() + absl::Seconds(1));
      if (chain.ok()) replicas = chain->replicas;
      if (replicas.size() == size) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return replicas;
  }

  // Replica 0 in office and replica 1 caught up: both in the chain.
  void AwaitChainOfBoth() {
    ASSERT_TRUE(AwaitPrimary(0, absl::Seconds(10)));
    Init(shards_[0].get());
    Forward(*shards_[0], *shards_[1]);
    ASSERT_THAT(AwaitChain(2, absl::Seconds(5)), ElementsAre("0", "1"));
  }

  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<ShardMembership> membership_;
};

TEST_F(ShardOfficeTest, ANewJobsReplicaZeroTakesOfficeAndACaughtUpBackupJoinsItsChain) {
  std::unique_ptr<ShardOffice> backup = StartOffice(1);
  std::unique_ptr<ShardOffice> primary = StartOffice(0);
  ASSERT_TRUE(AwaitPrimary(0, absl::Seconds(10)));
  EXPECT_FALSE(shards_[1]->primary());
  EXPECT_EQ(shards_[0]->epoch(), 1);
  // The backup holds the primary's state once it has acknowledged it.
  Init(shards_[0].get());
  Forward(*shards_[0], *shards_[1]);
  EXPECT_THAT(AwaitChain(2, absl::Seconds(5)), ElementsAre("0", "1"));
}

// A new job's primary publishes no chain before its backup holds its state
// (and acknowledges nothing meanwhile: parameter_shard_replica_test.cc).
// Lost then, and started again without its state, replica 0 takes the
// office again as for a new job; the backup, in no chain, waits for it.
TEST_F(ShardOfficeTest, ANewJobsPrimaryLostBeforeItsFirstChainLeavesTheJobToReplicaZero) {
  std::unique_ptr<ShardOffice> backup = StartOffice(1);
  std::unique_ptr<ShardOffice> primary = StartOffice(0);
  ASSERT_TRUE(AwaitPrimary(0, absl::Seconds(10)));
  Init(shards_[0].get());
  EXPECT_EQ(membership_->ReadChain(absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);

  primary.reset();
  shards_[0] = MakeReplica(0);
  primary = StartOffice(0);
  ASSERT_TRUE(AwaitPrimary(0, absl::Seconds(10)));
  EXPECT_EQ(shards_[0]->epoch(), 2);
  EXPECT_FALSE(shards_[1]->primary());
  Init(shards_[0].get());
  Forward(*shards_[0], *shards_[1]);
  EXPECT_THAT(AwaitChain(2, absl::Seconds(5)), ElementsAre("0", "1"));
}

// A new job's primary died without resigning (its lease of 30 s runs on)
// and was restarted at its address: the new process deposes the office its
// dead one held and takes it, long before the lease would lapse.
TEST_F(ShardOfficeTest, AReplicaRestartedAtItsAddressDeposesTheOfficeItsDeadProcessHeld) {
  {
    absl::StatusOr<std::unique_ptr<ShardMembership>> dead =
        ShardMembership::Create(client_.get(), kJob, 0);
    ASSERT_TRUE(dead.ok()) << dead.status();
    absl::StatusOr<CampaignResult> won =
        (*dead)->Campaign("127.0.0.1:7000", absl::Seconds(30), absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(won.ok()) << won.status();
    ASSERT_TRUE(won->elected);
  }  // abandoned, as by a crash: etcd keeps the office for the lease's 30 s
  const absl::Time restarted = absl::Now();
  std::unique_ptr<ShardOffice> primary = StartOffice(0, absl::Seconds(30));
  ASSERT_TRUE(AwaitPrimary(0, absl::Seconds(20)));
  EXPECT_LT(absl::Now() - restarted, absl::Seconds(10));
  EXPECT_EQ(shards_[0]->epoch(), 2);
}

TEST_F(ShardOfficeTest, ABackupOfTheChainTakesOverFromAPrimaryThatLeaves) {
  std::unique_ptr<ShardOffice> backup = StartOffice(1);
  std::unique_ptr<ShardOffice> primary = StartOffice(0);
  ASSERT_NO_FATAL_FAILURE(AwaitChainOfBoth());
  const absl::Time left = absl::Now();
  primary.reset();  // resigns
  EXPECT_FALSE(shards_[0]->primary());
  ASSERT_TRUE(AwaitPrimary(1, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - left, absl::Seconds(2));
  EXPECT_EQ(shards_[1]->epoch(), 2);
  EXPECT_THAT(AwaitChain(1, absl::Seconds(5)), ElementsAre("1"));
}

TEST_F(ShardOfficeTest, ABackupDroppedFromTheChainNeverTakesOver) {
  std::unique_ptr<ShardOffice> backup = StartOffice(1);
  std::unique_ptr<ShardOffice> primary = StartOffice(0);
  ASSERT_NO_FATAL_FAILURE(AwaitChainOfBoth());
  // Published before the backup leaves the commit rule.
  ASSERT_TRUE(primary->Drop(1, absl::Now() + absl::Seconds(5)).ok());
  absl::StatusOr<ReplicaChain> chain = membership_->ReadChain(absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_THAT(chain->replicas, ElementsAre("0"));
  EXPECT_TRUE(shards_[0]->CaughtUpBackups().empty());

  absl::StatusOr<PrimaryView> office = membership_->Current(absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(office.ok()) << office.status();
  primary.reset();
  // The office falls vacant and stays so: the watch's deadline is the clock.
  absl::StatusOr<PrimaryView> vacant =
      membership_->AwaitChange(*office, absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(vacant.ok()) << vacant.status();
  EXPECT_FALSE(vacant->primary.has_value());
  EXPECT_EQ(membership_->AwaitChange(*vacant, absl::Now() + absl::Seconds(3)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(shards_[1]->primary());
}

// A worker asked the backup for the primary's work; the primary does not
// answer as one (dead): the backup deposes it and takes office long before
// its lease of 30 s could run out.
TEST_F(ShardOfficeTest, ABackupAskedForThePrimaryDeposesOneThatDoesNotAnswer) {
  std::atomic<int> asked{0};
  std::unique_ptr<ShardOffice> backup =
      StartOffice(1, absl::Seconds(30), [&asked](const ShardPrimary& primary) {
        EXPECT_EQ(primary.address, "127.0.0.1:7000");
        EXPECT_EQ(primary.epoch, 1);
        ++asked;
        return false;
      });
  std::unique_ptr<ShardOffice> primary = StartOffice(0, absl::Seconds(30));
  ASSERT_NO_FATAL_FAILURE(AwaitChainOfBoth());
  const absl::Time sought = absl::Now();
  backup->PrimarySought();
  ASSERT_TRUE(AwaitPrimary(1, absl::Seconds(10)));
  EXPECT_LT(absl::Now() - sought, absl::Seconds(5));
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(shards_[1]->epoch(), 2);
  EXPECT_THAT(AwaitChain(1, absl::Seconds(5)), ElementsAre("1"));
}

// The same, but the primary answers: nothing changes.
TEST_F(ShardOfficeTest, ABackupAskedForThePrimaryLeavesOneThatAnswers) {
  std::atomic<int> asked{0};
  absl::Notification answered;  // the prober's one question, answered
  std::unique_ptr<ShardOffice> backup =
      StartOffice(1, absl::Seconds(30), [&asked, &answered](const ShardPrimary&) {
        if (++asked == 1) answered.Notify();
        return true;
      });
  std::unique_ptr<ShardOffice> primary = StartOffice(0, absl::Seconds(30));
  ASSERT_NO_FATAL_FAILURE(AwaitChainOfBoth());
  backup->PrimarySought();
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_EQ(asked.load(), 1);
  absl::StatusOr<PrimaryView> office = membership_->Current(absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(office.ok()) << office.status();
  ASSERT_TRUE(office->primary.has_value());
  EXPECT_EQ(office->primary->epoch, 1);
  EXPECT_TRUE(shards_[0]->primary());
  EXPECT_FALSE(shards_[1]->primary());
}

}  // namespace PST_FILE_ID
}  // namespace pst
