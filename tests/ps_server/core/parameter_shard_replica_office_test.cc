// How a shard's office begins (parameter_shard.h, ParameterShard::Office):
// a job's first office counts every backup in the commit rule from the
// start and acknowledges nothing before its first chain is published; an
// office after a chain acknowledges alone while its backups catch up.
#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)
using replica_testing::AsReplica;
using replica_testing::Forward;
using replica_testing::kAfterAChain;
using replica_testing::PullOrWait;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

// Replica `replica` of `replicas` whose primary is elected (a membership).
ShardOptions ElectedReplica(int replica, int replicas) {
  ShardOptions options = AsReplica(Options(ASYNC, 1), replica, replicas);
  options.elected = true;
  return options;
}

// Whether the primary's Stats show backup `replica` in the published chain.
bool BackupInChain(ParameterShard& primary, int replica) {
  StatsResponse stats;
  primary.Stats(&stats);
  for (const auto& backup : stats.replication().backups()) {
    if (backup.replica() == replica) return backup.in_chain();
  }
  return false;
}

// A job's first office: its backups count in the commit rule from the
// start, and nothing is acknowledged before the office has published its
// first chain, which waits for every backup that counts; one taken out of
// the rule (its sender gave up on it) is no longer waited for.
TEST(ParameterShardReplicaTest, AJobsFirstOfficeAcknowledgesNothingBeforeItsFirstChain) {
  auto primary = MakeShard(ElectedReplica(0, 3));
  auto backup = MakeShard(ElectedReplica(1, 3));
  ASSERT_TRUE(primary->BecomePrimary(1, ParameterShard::Office::kFirstOfJob).ok());
  Init(primary.get());
  int waits = 0;
  int woken = 0;
  EXPECT_NE(PullOrWait(*primary, &waits, &woken), 0);
  EXPECT_EQ(primary->ChainToPublish(), std::nullopt);

  Forward(*primary, *backup);
  EXPECT_THAT(primary->CaughtUpBackups(), ElementsAre(1));
  // Replica 2 counts too, and holds nothing yet.
  EXPECT_EQ(primary->ChainToPublish(), std::nullopt);
  EXPECT_NE(PullOrWait(*primary, &waits, &woken), 0);

  primary->SetReplicaLive(2, false);
  EXPECT_THAT(primary->ChainToPublish(), Optional(ElementsAre(1)));
  // The chain is not in the membership yet: a backup could not take over,
  // and Stats says so.
  EXPECT_NE(PullOrWait(*primary, &waits, &woken), 0);
  EXPECT_EQ(woken, 0);
  EXPECT_FALSE(BackupInChain(*primary, 1));

  primary->ChainPublished({1});
  EXPECT_EQ(woken, waits);
  EXPECT_EQ(PullOrWait(*primary, &waits, &woken), 0);
  EXPECT_TRUE(BackupInChain(*primary, 1));
}

// An office after a chain answers at once, alone: its backups join the
// commit rule as they catch up, while training goes on.
TEST(ParameterShardReplicaTest, AnOfficeAfterAChainAcknowledgesAloneWhileItsBackupsCatchUp) {
  auto primary = MakeShard(ElectedReplica(0, 3));
  ASSERT_TRUE(primary->BecomePrimary(1, kAfterAChain).ok());
  Init(primary.get());
  int waits = 0;
  int woken = 0;
  EXPECT_EQ(PullOrWait(*primary, &waits, &woken), 0);
  EXPECT_THAT(primary->ChainToPublish(), Optional(IsEmpty()));
}

}  // namespace PST_FILE_ID
}  // namespace pst
