// A backup that comes back (parameter_shard.h, "Replicas"): it takes the
// state whole and the log after it while training goes on, joins the
// chain only once it holds everything acknowledged, and starts again from
// a new primary when a failover comes during its catch-up.
#include <memory>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)
using replica_testing::AsReplica;
using replica_testing::ExpectSameState;
using replica_testing::Forward;
using replica_testing::InitEvicting;
using replica_testing::kAfterAChain;
using replica_testing::SyncStep;

TEST(ParameterShardReplicaTest, ABackupThatComesBackTakesTheStateWhole) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  InitEvicting(primary.get());
  Forward(*primary, *backup);
  std::mt19937_64 draw(13);
  SyncStep(*primary, draw);
  Forward(*primary, *backup);
  primary->SetReplicaLive(1, false);
  for (int step = 0; step < 5; ++step) {
    SyncStep(*primary, draw);
    EXPECT_EQ(PullAll(primary.get(), {3}).version, step + 2);  // nothing waits for it
  }
  primary->SetReplicaLive(1, true);
  int whole = 0;
  EXPECT_EQ(Forward(*primary, *backup, &whole), 1);
  EXPECT_EQ(whole, 1);
  ExpectSameState(*primary, *backup);
  SyncStep(*primary, draw);
  EXPECT_EQ(Forward(*primary, *backup, &whole), 1);
  EXPECT_EQ(whole, 1);
  ExpectSameState(*primary, *backup);
}

TEST(ParameterShardReplicaTest, ABackupThatComesBackCatchesUpWhileTrainingGoesOn) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  InitEvicting(primary.get());
  Forward(*primary, *backup);
  ASSERT_THAT(primary->CaughtUpBackups(), ::testing::ElementsAre(1));
  primary->SetReplicaLive(1, false);
  primary->SetReplicaLive(1, true);
  EXPECT_THAT(primary->CaughtUpBackups(), ::testing::IsEmpty());
  // The state whole is on its way while the workers train on: nothing
  // waits for it, past the bound a backup in the commit rule may lag.
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> whole =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), 1u);
  std::mt19937_64 draw(17);
  const int64_t steps = ParameterShard::kMaxUnreplicated + 4;
  for (int64_t step = 1; step <= steps; ++step) {
    SyncStep(*primary, draw);
    EXPECT_EQ(PullAll(primary.get(), {1}).version, step);
  }
  ReplicaAck ack;
  ASSERT_TRUE(backup->ApplyReplicaUpdate(*whole->front(), &ack).ok());
  primary->ReplicaAcked(1, ack.version());
  EXPECT_EQ(primary->replicated_version(), steps);  // still too far behind to count
  EXPECT_THAT(primary->CaughtUpBackups(), ::testing::IsEmpty());
  // The log since the state brings it up to date, and into the chain.
  int wholes = 0;
  EXPECT_EQ(Forward(*primary, *backup, &wholes), steps);
  EXPECT_EQ(wholes, 0);
  ExpectSameState(*primary, *backup);
  EXPECT_THAT(primary->CaughtUpBackups(), ::testing::ElementsAre(1));
  // Back in the commit rule: a step's pull waits for it again.
  SyncStep(*primary, draw);
  EXPECT_EQ(primary->replicated_version(), steps);
  EXPECT_EQ(Forward(*primary, *backup), 1);
  EXPECT_EQ(PullAll(primary.get(), {1}).version, steps + 1);
}

TEST(ParameterShardReplicaTest, ABackupJoinsTheChainOnlyOnceItHoldsWhatWasAcknowledged) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  // A new office: no backup counts until it holds a state of this office.
  ASSERT_TRUE(primary->BecomePrimary(1, kAfterAChain).ok());
  InitEvicting(primary.get());
  std::mt19937_64 draw(19);
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> whole =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), 1u);
  for (int step = 1; step <= 3; ++step) {
    SyncStep(*primary, draw);
    EXPECT_EQ(PullAll(primary.get(), {2}).version, step);  // acknowledged without it
  }
  // It holds version 0, close enough to join the commit rule: from now on
  // it holds back pulls, but versions 1-3 were acknowledged without it, so
  // it may take over only once it holds them.
  ReplicaAck ack;
  ASSERT_TRUE(backup->ApplyReplicaUpdate(*whole->front(), &ack).ok());
  primary->ReplicaAcked(1, ack.version());
  EXPECT_EQ(primary->replicated_version(), 0);
  EXPECT_THAT(primary->CaughtUpBackups(), ::testing::IsEmpty());
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> next =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->size(), 3u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(backup->ApplyReplicaUpdate(*(*next)[i], &ack).ok());
    primary->ReplicaAcked(1, ack.version());
    EXPECT_THAT(primary->CaughtUpBackups(), ::testing::IsEmpty());
  }
  ASSERT_TRUE(backup->ApplyReplicaUpdate(*(*next)[2], &ack).ok());
  primary->ReplicaAcked(1, ack.version());
  EXPECT_THAT(primary->CaughtUpBackups(), ::testing::ElementsAre(1));
  ExpectSameState(*primary, *backup);
}

// Three replicas; the third comes back and is taking the state whole when
// the primary dies. The second takes over, sends it its own state whole,
// and it catches up from there: what the old primary sent it late is
// fenced off once it follows the new one.
TEST(ParameterShardReplicaTest, AFailoverDuringACatchUpStartsItAgainFromTheNewPrimary) {
  auto first = MakeShard(AsReplica(Options(SYNC, 2), 0, 3));
  auto second = MakeShard(AsReplica(Options(SYNC, 2), 1, 3));
  auto third = MakeShard(AsReplica(Options(SYNC, 2), 2, 3));
  ASSERT_TRUE(first->BecomePrimary(1, kAfterAChain).ok());
  InitEvicting(first.get());
  std::mt19937_64 draw(23);
  const auto step_forwarding_to_second = [&] {
    SyncStep(*first, draw);
    EXPECT_EQ(Forward(*first, *second), 1);
  };
  Forward(*first, *second);
  Forward(*first, *third, nullptr, 2);
  step_forwarding_to_second();
  Forward(*first, *third, nullptr, 2);
  ASSERT_THAT(first->CaughtUpBackups(), ::testing::ElementsAre(1, 2));

  // The third goes away and comes back: its state whole is on its way, and
  // a step after it in the log, when the first dies.
  first->SetReplicaLive(2, false);
  step_forwarding_to_second();
  first->SetReplicaLive(2, true);
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> late =
      first->TakeReplicaUpdates(2, absl::Now());
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_EQ(late->size(), 1u);
  step_forwarding_to_second();
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> later =
      first->TakeReplicaUpdates(2, absl::Now());
  ASSERT_TRUE(later.ok()) << later.status();
  ASSERT_EQ(later->size(), 1u);
  const int64_t acknowledged = first->version();
  first.reset();

  // The second, in the chain, takes over; nothing of the new office waits
  // for the third until it holds the new primary's state.
  ASSERT_TRUE(second->BecomePrimary(2, kAfterAChain).ok());
  second->SetReplicaLive(0, false);
  EXPECT_EQ(second->version(), acknowledged);
  EXPECT_THAT(second->CaughtUpBackups(), ::testing::IsEmpty());
  ReplicaAck ack;
  ASSERT_TRUE(third->ApplyReplicaUpdate(*late->front(), &ack).ok());  // still at epoch 1
  SyncStep(*second, draw);
  EXPECT_EQ(PullAll(second.get(), {1}).version, acknowledged + 1);
  int whole = 0;
  EXPECT_EQ(Forward(*second, *third, &whole, 2), 1);  // its state whole, step included
  EXPECT_EQ(whole, 1);
  ExpectSameState(*second, *third);
  EXPECT_THAT(second->CaughtUpBackups(), ::testing::ElementsAre(2));
  EXPECT_EQ(third->epoch(), 2);

  // The old primary's last update, arriving now, is fenced off.
  EXPECT_EQ(third->ApplyReplicaUpdate(*later->front(), &ack).code(),
            absl::StatusCode::kFailedPrecondition);
  ExpectSameState(*second, *third);
  SyncStep(*second, draw);
  EXPECT_EQ(Forward(*second, *third, nullptr, 2), 1);
  ExpectSameState(*second, *third);
}

}  // namespace PST_FILE_ID
}  // namespace pst
