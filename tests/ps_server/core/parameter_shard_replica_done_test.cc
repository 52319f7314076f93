// A replicated shard and the workers that finished (parameter_shard.h,
// "Replicas"): a backup learns a worker's Done from its primary's updates
// or from the worker itself, keeps it through an older update that
// arrives after it, drops it for a worker registered again, and holds the
// run's final state only once it holds the primary's version at the Dones.
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps_server/core/lease_tracker.h"
#include "ps_server/core/parameter_shard.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)
using replica_testing::AsReplica;
using replica_testing::DensePush;
using replica_testing::Forward;
using replica_testing::kAfterAChain;

void Finish(ParameterShard& shard, int worker) {
  DoneRequest done;
  done.set_worker(worker);
  DoneResponse answer;
  ASSERT_TRUE(shard.Done(done, &answer).ok());
}

void RegisterAgain(ParameterShard& shard, int worker) {
  RegisterRequest again;
  again.set_worker(worker);
  RegisterResponse registered;
  ASSERT_TRUE(shard.Register(again, &registered).ok());
}

// A SYNC step of both workers' dense pushes, at the shard's version.
void DenseSyncStep(ParameterShard& shard) {
  const int64_t version = shard.version();
  PushResponse response;
  for (int worker = 0; worker < 2; ++worker) {
    ASSERT_TRUE(Push(shard, DensePush(worker, version), &response).ok());
  }
  ASSERT_EQ(shard.version(), version + 1);
}

int WorkersDone(ParameterShard& shard) {
  StatsResponse stats;
  shard.Stats(&stats);
  return stats.workers_done();
}

// A worker that finished early is known done to the backup, through the
// primary's next update or its own Done: a backup that takes over makes
// the remaining worker's steps without waiting for it.
TEST(ParameterShardReplicaTest, ANewPrimaryDoesNotWaitForAWorkerThatWasDone) {
  ManualLeaseClock clock;
  ShardOptions options = Options(SYNC, 2);
  options.lease = absl::Seconds(5);
  options.lease_clock = &clock;
  for (const bool told_directly : {false, true}) {
    SCOPED_TRACE(told_directly ? "the backup told by the worker" : "through the update");
    auto primary = MakeShard(AsReplica(options, 0));
    auto backup = MakeShard(AsReplica(options, 1));
    Init(primary.get());
    Forward(*primary, *backup);
    Finish(*primary, 1);
    if (told_directly) {
      Finish(*backup, 1);
    } else {
      // Worker 0 steps alone at the primary; the update names worker 1 done.
      PushResponse response;
      ASSERT_TRUE(Push(*primary, DensePush(0, 0), &response).ok());
      ASSERT_EQ(response.outcome(), PushResponse::APPLIED);
      EXPECT_EQ(Forward(*primary, *backup), 1);
    }
    EXPECT_EQ(WorkersDone(*backup), 1);
    ASSERT_TRUE(backup->BecomePrimary(2, kAfterAChain).ok());
    const int64_t version = backup->version();
    PushResponse response;
    ASSERT_TRUE(Push(*backup, DensePush(0, version), &response).ok());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);  // not AGGREGATED, waiting a lease
    EXPECT_EQ(backup->version(), version + 1);
  }
}

// The backup holds exactly the primary's done workers: one that registered
// again at the primary is not done at the backup after the next update.
TEST(ParameterShardReplicaTest, AWorkerRegisteredAgainIsNotDoneAtTheBackup) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  Finish(*primary, 1);
  Finish(*backup, 1);
  RegisterAgain(*primary, 1);
  DenseSyncStep(*primary);
  ASSERT_EQ(primary->version(), 1);
  EXPECT_EQ(Forward(*primary, *backup), 1);
  EXPECT_EQ(WorkersDone(*backup), 0);
  // An update naming a worker the job does not have is refused whole.
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> none =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  DenseSyncStep(*primary);
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> next =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->size(), 1u);
  ReplicaUpdate bad = *next->front();
  bad.add_workers_done(2);
  ReplicaAck ack;
  EXPECT_EQ(backup->ApplyReplicaUpdate(bad, &ack).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backup->version(), 1);
}

// A SYNC shard of 2 workers and its backup, both holding the initial
// state, the primary a dense step ahead (version 1) that it has not
// forwarded yet.
std::pair<std::unique_ptr<ParameterShard>, std::unique_ptr<ParameterShard>>
PrimaryAStepAheadOfItsBackup() {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  DenseSyncStep(*primary);
  return {std::move(primary), std::move(backup)};
}

// A backup told a worker's Done directly (after the primary, with the
// primary's version then) keeps it through an update of the primary's
// captured before the Done and applied after it; a newer update that does
// not name the worker (it registered again at the primary) clears it.
TEST(ParameterShardReplicaTest, ADoneToldTheBackupOutlivesAnOlderUpdateThatArrivesAfterIt) {
  auto [primary, backup] = PrimaryAStepAheadOfItsBackup();
  ASSERT_EQ(primary->version(), 1);
  // Version 1's update is on its way to the backup when worker 1 is done.
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> in_flight =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(in_flight.ok());
  ASSERT_EQ(in_flight->size(), 1u);
  DoneRequest done;
  done.set_worker(1);
  DoneResponse at_primary;
  ASSERT_TRUE(primary->Done(done, &at_primary).ok());
  EXPECT_TRUE(at_primary.primary());
  EXPECT_EQ(at_primary.version(), 1);
  done.set_primary_version(at_primary.version());
  DoneResponse at_backup;
  ASSERT_TRUE(backup->Done(done, &at_backup).ok());
  EXPECT_FALSE(at_backup.primary());
  ReplicaAck ack;
  ASSERT_TRUE(backup->ApplyReplicaUpdate(*in_flight->front(), &ack).ok());
  ASSERT_EQ(backup->version(), 1);
  EXPECT_EQ(WorkersDone(*backup), 1);

  RegisterAgain(*primary, 1);
  DenseSyncStep(*primary);
  ASSERT_EQ(primary->version(), 2);
  EXPECT_EQ(Forward(*primary, *backup), 1);
  EXPECT_EQ(WorkersDone(*backup), 0);
}

// A backup told every worker's Done directly, at the primary's version
// then, holds the run's final state (what its checkpoint marks finished)
// only once it has applied that version; the primary holds it at once.
TEST(ParameterShardReplicaTest,
     ABackupHoldsTheFinalStateOnlyOnceItHoldsThePrimarysVersionAtTheDones) {
  auto [primary, backup] = PrimaryAStepAheadOfItsBackup();
  ASSERT_EQ(primary->version(), 1);
  ASSERT_EQ(backup->version(), 0);
  EXPECT_FALSE(primary->holds_final_state());
  for (int worker : {0, 1}) {
    DoneRequest done;
    done.set_worker(worker);
    DoneResponse at_primary;
    ASSERT_TRUE(primary->Done(done, &at_primary).ok());
    done.set_primary_version(at_primary.version());
    DoneResponse at_backup;
    ASSERT_TRUE(backup->Done(done, &at_backup).ok());
  }
  EXPECT_TRUE(primary->holds_final_state());
  EXPECT_EQ(WorkersDone(*backup), 2);
  EXPECT_FALSE(backup->holds_final_state());
  EXPECT_EQ(Forward(*primary, *backup), 1);
  ASSERT_EQ(backup->version(), 1);
  EXPECT_TRUE(backup->holds_final_state());
}

}  // namespace PST_FILE_ID
}  // namespace pst
