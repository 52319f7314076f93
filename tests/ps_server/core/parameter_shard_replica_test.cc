// A shard's primary and its backup (parameter_shard.h, "Replicas"): the
// backup holds bitwise what the primary held at every version it
// acknowledged, pulls wait for the backups (the commit rule), a backup
// fences off older epochs and updates out of order, a push repeated after
// a failover is applied once, and a primary that steps down answers no
// worker. A job's first office: parameter_shard_replica_office_test.cc. A backup that comes
// back: parameter_shard_replica_catch_up_test.cc.
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/transient_refusal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"
#include "tests/ps_server/core/parameter_shard_replica_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)
using replica_testing::AsReplica;
using replica_testing::DensePush;
using replica_testing::ExpectSameState;
using replica_testing::Forward;
using replica_testing::InitEvicting;
using replica_testing::kAfterAChain;
using replica_testing::PullOrWait;
using replica_testing::SyncStep;

TEST(ParameterShardReplicaTest, ABackupHoldsBitwiseWhatItsPrimaryHeldAtEveryVersion) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  ASSERT_TRUE(primary->primary());
  ASSERT_FALSE(backup->primary());
  InitEvicting(primary.get());
  int whole = 0;
  EXPECT_EQ(Forward(*primary, *backup, &whole), 1);
  EXPECT_EQ(whole, 1);  // the Init's state, whole
  ExpectSameState(*primary, *backup);
  std::mt19937_64 draw(5);
  for (int step = 0; step < 30; ++step) {
    SyncStep(*primary, draw);
    EXPECT_EQ(Forward(*primary, *backup, &whole), 1);
    ExpectSameState(*primary, *backup);
    // The step is replicated: its pull is answered.
    EXPECT_EQ(PullAll(primary.get(), {1, 2}, step % 2).version, step + 1);
  }
  EXPECT_EQ(whole, 1);
  // The updates removed rows as well as trained them.
  StatsResponse stats;
  primary->Stats(&stats);
  ASSERT_EQ(stats.embeddings_size(), 1);
  EXPECT_GT(stats.embeddings(0).rows_evicted() + stats.embeddings(0).rows_expired(), 0);
}

TEST(ParameterShardReplicaTest, APullWaitsUntilEveryLiveBackupHoldsWhatItShows) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  int waits = 0;
  int woken = 0;
  auto pull_or_wait = [&] { return PullOrWait(*primary, &waits, &woken); };
  // Not even the Init is replicated yet.
  EXPECT_NE(pull_or_wait(), 0);
  Forward(*primary, *backup);
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(pull_or_wait(), 0);

  PushResponse response;
  ASSERT_TRUE(Push(*primary, DensePush(0, 0), &response).ok());
  ASSERT_EQ(response.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(primary->replicated_version(), 0);
  // The worker's answer would acknowledge its push, which the backup lacks.
  EXPECT_NE(pull_or_wait(), 0);
  EXPECT_EQ(Forward(*primary, *backup), 1);
  EXPECT_EQ(woken, 2);
  EXPECT_EQ(primary->replicated_version(), 1);
  EXPECT_EQ(pull_or_wait(), 0);

  // A backup that is not live holds nothing back.
  ASSERT_TRUE(Push(*primary, DensePush(0, 1), &response).ok());
  EXPECT_NE(pull_or_wait(), 0);
  primary->SetReplicaLive(1, false);
  EXPECT_EQ(woken, 3);
  EXPECT_EQ(primary->replicated_version(), 2);
  EXPECT_EQ(pull_or_wait(), 0);
}

TEST(ParameterShardReplicaTest, UpdatesWaitWhileALiveBackupLagsTooFar) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  PushResponse response;
  for (int64_t v = 0; v < ParameterShard::kMaxUnreplicated; ++v) {
    std::optional<absl::Status> pushed = primary->TryPush(DensePush(0, v), &response);
    ASSERT_TRUE(pushed.has_value());
    ASSERT_TRUE(pushed->ok()) << *pushed;
  }
  EXPECT_FALSE(primary->TryPush(DensePush(0, primary->version()), &response).has_value());
  EXPECT_EQ(Forward(*primary, *backup), ParameterShard::kMaxUnreplicated);
  ExpectSameState(*primary, *backup);
  std::optional<absl::Status> pushed =
      primary->TryPush(DensePush(0, primary->version()), &response);
  ASSERT_TRUE(pushed.has_value());
  EXPECT_TRUE(pushed->ok()) << *pushed;
}

TEST(ParameterShardReplicaTest, ABackupRefusesAnOlderEpochAndAnUpdateOutOfOrder) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  ASSERT_TRUE(primary->BecomePrimary(3, kAfterAChain).ok());
  EXPECT_EQ(primary->BecomePrimary(2, kAfterAChain).code(), absl::StatusCode::kFailedPrecondition);
  InitEvicting(primary.get());
  Forward(*primary, *backup);
  EXPECT_EQ(backup->epoch(), 3);
  std::mt19937_64 draw(9);
  SyncStep(*primary, draw);
  SyncStep(*primary, draw);
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> updates =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(updates.ok()) << updates.status();
  ASSERT_EQ(updates->size(), 2u);

  // The second before the first: refused, and the answer says where the
  // backup stands.
  ReplicaAck ack;
  EXPECT_EQ(backup->ApplyReplicaUpdate(*(*updates)[1], &ack).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ack.version(), 0);
  EXPECT_EQ(backup->version(), 0);
  // From an older epoch: refused whatever it holds.
  ReplicaUpdate stale = *(*updates)[0];
  stale.set_epoch(2);
  EXPECT_EQ(backup->ApplyReplicaUpdate(stale, &ack).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ack.epoch(), 3);
  EXPECT_EQ(backup->version(), 0);

  // The primary sends again from what the backup holds.
  primary->ReplicaResync(1, ack.version());
  int whole = 0;
  EXPECT_EQ(Forward(*primary, *backup, &whole), 2);
  EXPECT_EQ(whole, 0);
  ExpectSameState(*primary, *backup);
}

// Applies `update` to `backup`, counting the acknowledgements and keeping
// what the first one said.
absl::Status ApplyCounting(ParameterShard& backup, const ReplicaUpdate& update, int* acknowledged,
                           ReplicaAck* said) {
  ReplicaAck ack;
  return backup.ApplyReplicaUpdate(update, &ack, [&] {
    if ((*acknowledged)++ == 0) *said = ack;
  });
}

// What `primary` has for its backup 1 (none, with a failure, where it fails).
std::vector<std::shared_ptr<const ReplicaUpdate>> TakeForBackup(ParameterShard& primary) {
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> updates =
      primary.TakeReplicaUpdates(1, absl::Now());
  EXPECT_TRUE(updates.ok()) << updates.status();
  if (!updates.ok()) return {};
  return *std::move(updates);
}

// A SYNC primary (InitEvicting) and its backup 1, two steps taken: what
// the backup is sent after the first (the state whole, at version 1) and
// after the second (version 2's update).
struct TwoVersions {
  std::unique_ptr<ParameterShard> primary;
  std::unique_ptr<ParameterShard> backup;
  std::vector<std::shared_ptr<const ReplicaUpdate>> whole;
  std::vector<std::shared_ptr<const ReplicaUpdate>> next;
};
TwoVersions TakeTwoVersions(uint64_t seed) {
  TwoVersions taken{.primary = MakeShard(AsReplica(Options(SYNC, 2), 0)),
                    .backup = MakeShard(AsReplica(Options(SYNC, 2), 1)),
                    .whole = {},
                    .next = {}};
  InitEvicting(taken.primary.get());
  std::mt19937_64 draw(seed);
  SyncStep(*taken.primary, draw);
  taken.whole = TakeForBackup(*taken.primary);
  SyncStep(*taken.primary, draw);
  taken.next = TakeForBackup(*taken.primary);
  return taken;
}

TEST(ParameterShardReplicaTest, ABackupAcknowledgesAnUpdateOnceAndNeverARefusedOne) {
  const TwoVersions taken = TakeTwoVersions(9);
  ParameterShard* primary = taken.primary.get();
  ParameterShard* backup = taken.backup.get();
  const auto& updates = taken.whole;
  const auto& next = taken.next;
  ASSERT_EQ(updates.size(), 1u);  // the state whole, at version 1
  ASSERT_EQ(next.size(), 1u);     // version 2's rows

  int acknowledged = 0;
  ReplicaAck said;
  // Out of order: refused, and not acknowledged.
  EXPECT_EQ(ApplyCounting(*backup, *next.front(), &acknowledged, &said).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(acknowledged, 0);
  // The state whole, then the version: each acknowledged once, as applied
  // at its version and the primary's epoch.
  ASSERT_TRUE(ApplyCounting(*backup, *updates.front(), &acknowledged, &said).ok());
  EXPECT_EQ(acknowledged, 1);
  EXPECT_TRUE(said.applied());
  EXPECT_EQ(said.version(), 1);
  acknowledged = 0;
  ASSERT_TRUE(ApplyCounting(*backup, *next.front(), &acknowledged, &said).ok());
  EXPECT_EQ(acknowledged, 1);
  EXPECT_TRUE(said.applied());
  EXPECT_EQ(said.version(), 2);
  EXPECT_EQ(said.epoch(), primary->epoch());
  primary->ReplicaAcked(1, said.version());
  ExpectSameState(*primary, *backup);
}

TEST(ParameterShardReplicaTest, AnUpdateWhoseDenseVariablesDoNotFitIsRefusedAndChangesNothing) {
  const TwoVersions taken = TakeTwoVersions(4);
  ParameterShard* primary = taken.primary.get();
  ParameterShard* backup = taken.backup.get();
  const auto& whole = taken.whole;
  const auto& next = taken.next;
  ASSERT_EQ(whole.size(), 1u);
  ASSERT_EQ(next.size(), 1u);
  const ReplicaUpdate& update = *next.front();
  // The version's dense update travels as its optimizer step, not whole.
  ASSERT_EQ(update.dense_steps().steps_size(), 1);
  EXPECT_EQ(update.dense_steps().steps(0).gradient().size(), 2 * sizeof(float));
  EXPECT_EQ(update.state().variables_size(), 0);

  int acknowledged = 0;
  ReplicaAck said;
  ASSERT_TRUE(ApplyCounting(*backup, *whole.front(), &acknowledged, &said).ok());
  // The whole form names the dense optimizer, as a delta's would.
  const std::string optimizer = whole.front()->state().optimizer();
  ASSERT_FALSE(optimizer.empty());
  const std::vector<std::function<void(ReplicaUpdate*)>> breaks = {
      [&](ReplicaUpdate* u) {  // neither steps nor variables
        u->clear_dense_steps();
        u->mutable_state()->set_optimizer(optimizer);
      },
      [&](ReplicaUpdate* u) {  // another variable whole
        u->clear_dense_steps();
        u->mutable_state()->set_optimizer(optimizer);
        ShardCheckpoint::Variable* v = u->mutable_state()->add_variables();
        v->set_name("other");
        v->add_shape(2);
        v->set_values(std::string(2 * sizeof(float), '\0'));
      },
      [](ReplicaUpdate* u) {  // a step over another update count
        u->mutable_dense_steps()->mutable_steps(0)->set_update(7);
      },
  };
  for (size_t i = 0; i < breaks.size(); ++i) {
    ReplicaUpdate broken = update;
    breaks[i](&broken);
    acknowledged = 0;
    EXPECT_EQ(ApplyCounting(*backup, broken, &acknowledged, &said).code(),
              absl::StatusCode::kInvalidArgument)
        << i;
    EXPECT_EQ(acknowledged, 0) << i;
    EXPECT_EQ(said.version(), 1) << i;  // still holds version 1, unchanged
  }
  ASSERT_TRUE(ApplyCounting(*backup, update, &acknowledged, &said).ok());
  ExpectSameState(*primary, *backup);
}

TEST(ParameterShardReplicaTest,
     AnUpdateThatFailsAfterItsAcknowledgementLeavesTheBackupAskingForTheState) {
  auto primary = MakeShard(AsReplica(Options(SYNC, 2), 0));
  auto backup = MakeShard(AsReplica(Options(SYNC, 2), 1));
  InitEvicting(primary.get());  // at most 8 rows
  Forward(*primary, *backup);
  std::mt19937_64 draw(9);
  SyncStep(*primary, draw);
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> updates =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(updates.ok()) << updates.status();
  ASSERT_EQ(updates->size(), 1u);
  // Rows the backup's table has no room for: the update passes every check
  // (sizes, ids, finite values), so it is acknowledged, and then fails to
  // apply; only tables that are not the primary's can get there, or a
  // failing disk tier.
  ReplicaUpdate crowded = *updates->front();
  ShardCheckpoint::Embedding* table = crowded.mutable_state()->mutable_embeddings(0);
  for (uint64_t id = 100; id < 110; ++id) {
    const float values[kDim] = {0.5f, 0.5f, 0.5f, 0.5f};
    const float slots[kDim] = {1, 1, 1, 1};
    const int64_t updates_of_row = 1;
    table->mutable_ids()->append(reinterpret_cast<const char*>(&id), sizeof(id));
    table->mutable_values()->append(reinterpret_cast<const char*>(values), sizeof(values));
    table->mutable_slots()->append(reinterpret_cast<const char*>(slots), sizeof(slots));
    table->mutable_row_updates()->append(reinterpret_cast<const char*>(&updates_of_row),
                                         sizeof(updates_of_row));
  }
  int acknowledged = 0;
  ReplicaAck said;
  EXPECT_EQ(ApplyCounting(*backup, crowded, &acknowledged, &said).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(acknowledged, 1);
  EXPECT_EQ(said.version(), 1);
  primary->ReplicaAcked(1, said.version());

  // It holds no state now: it refuses the next version and says so, and
  // the primary sends it the state whole.
  SyncStep(*primary, draw);
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> next =
      primary->TakeReplicaUpdates(1, absl::Now());
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->size(), 1u);
  ReplicaAck ack;
  EXPECT_EQ(backup->ApplyReplicaUpdate(*next->front(), &ack).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ack.version(), -1);
  primary->ReplicaResync(1, ack.version());
  int whole = 0;
  EXPECT_EQ(Forward(*primary, *backup, &whole), 1);
  EXPECT_EQ(whole, 1);
  ExpectSameState(*primary, *backup);
}

TEST(ParameterShardReplicaTest, ABackupRefusesWorkersAndAPrimaryOfANewerEpochDeposesTheOld) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  PushResponse response;
  std::optional<absl::Status> refused = backup->TryPush(DensePush(0, 0), &response);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backup->version(), 0);

  // The backup takes over at epoch 1; the old primary, told by its update,
  // becomes its backup and follows it.
  ASSERT_TRUE(backup->BecomePrimary(1, kAfterAChain).ok());
  ASSERT_TRUE(Push(*backup, DensePush(0, 0), &response).ok());
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> updates =
      backup->TakeReplicaUpdates(0, absl::Now());
  ASSERT_TRUE(updates.ok()) << updates.status();
  ASSERT_EQ(updates->size(), 1u);
  ReplicaAck ack;
  ASSERT_TRUE(primary->ApplyReplicaUpdate(*updates->front(), &ack).ok());
  EXPECT_FALSE(primary->primary());
  EXPECT_EQ(primary->epoch(), 1);
  EXPECT_EQ(ack.version(), 1);
  ExpectSameState(*primary, *backup);
  refused = primary->TryPush(DensePush(0, 1), &response);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ParameterShardReplicaTest, ANewPrimaryWaitsAWholeLeaseForEveryWorkerBeforeAStepGoesOnWithout) {
  ManualLeaseClock clock;
  ShardOptions options = Options(SYNC, 2);
  options.lease = absl::Seconds(5);
  options.lease_clock = &clock;
  auto primary = MakeShard(AsReplica(options, 0));
  auto backup = MakeShard(AsReplica(options, 1));
  Init(primary.get());
  Forward(*primary, *backup);
  // A worker's heartbeats reached the backup once (a replica restarted at
  // its predecessor's address), then went to the primary: the backup lets
  // the leases run out.
  for (int worker = 0; worker < 2; ++worker) {
    HeartbeatRequest heartbeat;
    heartbeat.set_worker(worker);
    HeartbeatResponse answer;
    ASSERT_TRUE(backup->Heartbeat(heartbeat, &answer).ok());
  }
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(Eventually([&] {
    StatsResponse stats;
    backup->Stats(&stats);
    return !stats.workers(0).live() && !stats.workers(1).live();
  }));
  // It takes office: worker 0, first to find it, does not make the step
  // alone; worker 1 has a whole lease to follow.
  ASSERT_TRUE(backup->BecomePrimary(1, kAfterAChain).ok());
  PushResponse response;
  ASSERT_TRUE(Push(*backup, DensePush(0, 0), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::AGGREGATED);
  ASSERT_TRUE(Push(*backup, DensePush(1, 0), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(backup->version(), 1);
}

PushRequest Sequenced(PushRequest push, int64_t sequence) {
  push.set_sequence(sequence);
  return push;
}

TEST(ParameterShardReplicaTest, APushSentAgainAfterAFailoverIsAppliedOnce) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  PushResponse response;
  ASSERT_TRUE(Push(*primary, Sequenced(DensePush(0, 0), 0), &response).ok());
  ASSERT_EQ(response.outcome(), PushResponse::APPLIED);
  // The backup holds the push (its clocks came with it), but the primary
  // died before its worker heard: the worker sends it to the new primary.
  Forward(*primary, *backup);
  ASSERT_TRUE(backup->BecomePrimary(2, kAfterAChain).ok());
  ASSERT_TRUE(Push(*backup, Sequenced(DensePush(0, 0), 0), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::DUPLICATE);
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(backup->version(), 1);
  // So is a push streamed in: read, answered by Push, applied nothing.
  absl::StatusOr<ParameterShard::StreamedPush> streamed =
      backup->BeginStreamedPush(Sequenced(DensePush(0, 0), 0));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->update, nullptr);
  EXPECT_EQ(streamed->bytes.size(), 1u);
  // The next one is new; one without a sequence is never taken for a repeat.
  ASSERT_TRUE(Push(*backup, Sequenced(DensePush(0, 1), 1), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  ASSERT_TRUE(Push(*backup, DensePush(0, 2), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  StatsResponse stats;
  backup->Stats(&stats);
  EXPECT_EQ(stats.pushes_repeated(), 1);
  EXPECT_EQ(stats.version(), 3);
}

// A worker whose exchange failed at another shard runs its step again, and
// sends this shard a push it took already: the repeat is answered with the
// version its first sending takes effect at, so the exchange's read waits
// for no later one (one that may never come).
TEST(ParameterShardReplicaTest, ARepeatIsAnsweredWithTheVersionItsFirstSendingMade) {
  auto shard = MakeShard(Options(SYNC, 2));
  Init(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Sequenced(DensePush(0, 0), 0), &response).ok());
  ASSERT_EQ(response.outcome(), PushResponse::AGGREGATED);
  // Its step waits for worker 1: the repeat takes effect at the next version.
  ASSERT_TRUE(Push(*shard, Sequenced(DensePush(0, 0), 0), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::DUPLICATE);
  EXPECT_EQ(response.version(), 1);
  ASSERT_TRUE(Push(*shard, Sequenced(DensePush(1, 0), 0), &response).ok());
  ASSERT_EQ(response.outcome(), PushResponse::APPLIED);
  ASSERT_EQ(shard->version(), 1);
  // The step made version 1; the step run again pushes at version 1.
  ASSERT_TRUE(Push(*shard, Sequenced(DensePush(0, 1), 0), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::DUPLICATE);
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(shard->version(), 1);
}

TEST(ParameterShardReplicaTest, APrimaryThatStepsDownRefusesThePullsItHeld) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  PushResponse response;
  ASSERT_TRUE(Push(*primary, DensePush(0, 0), &response).ok());
  PullRequest pull;
  pull.add_names("b");
  int woken = 0;
  auto pull_or_wait = [&] {
    return primary->PullVisitOrWait(
        pull, absl::InfiniteFuture(), [](int64_t, const auto&, const PulledRows&) {},
        [&woken] { ++woken; });
  };
  // Waiting for the backup to hold the push; then the lease is lost.
  absl::StatusOr<ParameterShard::WaitId> waiting = pull_or_wait();
  ASSERT_TRUE(waiting.ok());
  EXPECT_NE(*waiting, 0);
  primary->StepDown();
  EXPECT_FALSE(primary->primary());
  EXPECT_EQ(woken, 1);
  // Not an answer that would acknowledge what no backup holds: a refusal
  // that sends the worker to look for the primary.
  absl::StatusOr<ParameterShard::WaitId> refused = pull_or_wait();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MarkedTransient(refused.status()), TransientRefusal::kNotPrimary);
  RegisterRequest again;
  again.set_worker(0);
  RegisterResponse view;
  EXPECT_EQ(MarkedTransient(primary->Register(again, &view)), TransientRefusal::kNotPrimary);
}

// A push answered alone (an exchange that does not read) is acknowledged
// only once its backup holds it, as a pull's answer is; a primary that
// steps down meanwhile refuses it instead.
TEST(ParameterShardReplicaTest, APushAnsweredAloneWaitsUntilItsBackupHoldsIt) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  int woken = 0;
  auto replicated_or_wait = [&] {
    return primary->AwaitPushReplicatedOrWait(0, [&woken] { ++woken; });
  };
  absl::StatusOr<ParameterShard::WaitId> waiting = replicated_or_wait();
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(*waiting, 0);  // nothing of this worker's to wait for
  PushResponse response;
  ASSERT_TRUE(Push(*primary, DensePush(0, 0), &response).ok());
  waiting = replicated_or_wait();
  ASSERT_TRUE(waiting.ok());
  EXPECT_NE(*waiting, 0);
  EXPECT_EQ(woken, 0);
  EXPECT_EQ(Forward(*primary, *backup), 1);
  EXPECT_EQ(woken, 1);
  waiting = replicated_or_wait();
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(*waiting, 0);

  ASSERT_TRUE(Push(*primary, DensePush(0, 1), &response).ok());
  waiting = replicated_or_wait();
  ASSERT_TRUE(waiting.ok());
  EXPECT_NE(*waiting, 0);
  primary->StepDown();
  EXPECT_EQ(woken, 2);
  absl::StatusOr<ParameterShard::WaitId> refused = replicated_or_wait();
  EXPECT_EQ(MarkedTransient(refused.status()), TransientRefusal::kNotPrimary);
}

TEST(ParameterShardReplicaTest, AStreamedPushAwaitsItsTurnWhileABackupLagsTooFar) {
  auto primary = MakeShard(AsReplica(Options(ASYNC, 1), 0));
  auto backup = MakeShard(AsReplica(Options(ASYNC, 1), 1));
  Init(primary.get());
  Forward(*primary, *backup);
  PushResponse response;
  for (int64_t v = 0; v < ParameterShard::kMaxUnreplicated; ++v) {
    ASSERT_TRUE(Push(*primary, DensePush(0, v), &response).ok());
  }
  absl::StatusOr<ParameterShard::StreamedPush> streamed =
      primary->BeginStreamedPush(DensePush(0, primary->version()));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->update, nullptr);
  EXPECT_TRUE(streamed->awaits_turn);
  // No stream holds the staging: the wait ends when the backup catches up.
  int woken = 0;
  EXPECT_NE(primary->AwaitUpdateTurnOrWait([&woken] { ++woken; }), 0);
  EXPECT_EQ(Forward(*primary, *backup), ParameterShard::kMaxUnreplicated);
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(primary->AwaitUpdateTurnOrWait([] {}), 0);
}

}  // namespace PST_FILE_ID
}  // namespace pst
