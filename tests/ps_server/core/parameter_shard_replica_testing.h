// What the replica tests share: a primary and a backup of one shard, the
// shard's model and SYNC steps that change its rows, the forwarding between
// them, and the check that both hold the same state.
#ifndef PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_REPLICA_TESTING_H_
#define PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_REPLICA_TESTING_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/embedding_table_testing.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"

namespace pst::replica_testing {

// An office after a chain: the backups join the commit rule as they catch up.
constexpr ParameterShard::Office kAfterAChain = ParameterShard::Office::kAfterAChain;

// `options` as replica `replica` of `replicas`.
inline ShardOptions AsReplica(ShardOptions options, int replica, int replicas = 2) {
  options.replicas = replicas;
  options.replica = replica;
  return options;
}

// A pull of worker 0 at the primary: 0 if answered now, else the id of its
// wait (counted in `*waits`; `*woken` counts those woken).
inline ParameterShard::WaitId PullOrWait(ParameterShard& primary, int* waits, int* woken) {
  PullRequest pull;
  pull.add_names("b");
  absl::StatusOr<ParameterShard::WaitId> id = primary.PullVisitOrWait(
      pull, absl::InfiniteFuture(), [](int64_t, const auto&, const PulledRows&) {},
      [woken] { ++*woken; });
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return ParameterShard::WaitId{0};
  if (*id != 0) ++*waits;
  return *id;
}

// A push of worker `worker`'s gradient of the dense variable "b" (the
// shards of parameter_shard_embedding_testing.h), computed at `version`.
inline PushRequest DensePush(int worker, int64_t version) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{1, -1}, push.add_gradients());
  return push;
}

// "b" and the table "emb" under Adagrad: at most 8 rows, evicting, and
// rows untouched for 6 of its updates expire; so updates remove rows too.
inline void InitEvicting(ParameterShard* shard) {
  InitRequest init;
  EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{0, 0}, init.add_variables());
  EmbeddingTableConfig* table = init.add_embeddings();
  table->set_name("emb");
  table->set_dim(shard_embedding_testing::kDim);
  table->set_max_rows_per_shard(8);
  table->mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  table->mutable_optimizer()->mutable_adagrad()->set_initial_accumulator(0.1f);
  table->mutable_storage()->set_ttl_steps(6);
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  ASSERT_TRUE(response.accepted());
}

// A SYNC step of two workers, each pushing a draw of ids of [0, 20).
inline void SyncStep(ParameterShard& shard, std::mt19937_64& draw) {
  const int64_t version = shard.version();
  for (int w = 0; w < 2; ++w) {
    std::vector<uint64_t> ids;
    for (uint64_t id = 0; id < 20; ++id) {
      if (draw() % 5 == 0) ids.push_back(id);
    }
    PushResponse response;
    ASSERT_TRUE(Push(shard,
                     shard_embedding_testing::RowPush(w, version, ids,
                                                      shard_embedding_testing::Gradients(w, ids)),
                     &response)
                    .ok());
  }
  ASSERT_EQ(shard.version(), version + 1);
}

// Hands what `primary` has for its backup `to` (1 unless given) to
// `backup` and its answers back; returns how many updates went, of which
// `*whole` held the state whole.
inline int Forward(ParameterShard& primary, ParameterShard& backup, int* whole = nullptr,
                   int to = 1) {
  absl::StatusOr<std::vector<std::shared_ptr<const ReplicaUpdate>>> updates =
      primary.TakeReplicaUpdates(to, absl::Now());
  EXPECT_TRUE(updates.ok()) << updates.status();
  if (!updates.ok()) return 0;
  for (const auto& shared : *updates) {
    const ReplicaUpdate& update = *shared;
    if (whole != nullptr && !update.state().delta()) ++*whole;
    ReplicaAck ack;
    const absl::Status applied = backup.ApplyReplicaUpdate(update, &ack);
    EXPECT_TRUE(applied.ok()) << applied;
    primary.ReplicaAcked(to, ack.version());
  }
  return static_cast<int>(updates->size());
}

// Both shards hold the same version, variables, optimizer state, worker
// clocks and rows, bit for bit (rows compared by id: the replicas keep
// them in their own order and tiers).
inline void ExpectSameState(ParameterShard& a, ParameterShard& b) {
  const ShardCheckpoint x = a.Snapshot();
  const ShardCheckpoint y = b.Snapshot();
  EXPECT_EQ(x.version(), y.version());
  EXPECT_THAT(x.worker_clocks(), ::testing::ElementsAreArray(y.worker_clocks()));
  ASSERT_EQ(x.variables_size(), y.variables_size());
  for (int v = 0; v < x.variables_size(); ++v) {
    EXPECT_EQ(x.variables(v).SerializeAsString(), y.variables(v).SerializeAsString())
        << x.variables(v).name();
  }
  ASSERT_EQ(x.embeddings_size(), y.embeddings_size());
  for (int t = 0; t < x.embeddings_size(); ++t) {
    const ShardCheckpoint::Embedding& p = x.embeddings(t);
    const ShardCheckpoint::Embedding& q = y.embeddings(t);
    EXPECT_EQ(p.config().name(), q.config().name());
    EXPECT_TRUE(embedding_testing::RowsOf(p) == embedding_testing::RowsOf(q)) << p.config().name();
    EXPECT_EQ(p.updates(), q.updates());
    EXPECT_EQ(p.rows_admitted(), q.rows_admitted());
    EXPECT_EQ(p.rows_refused(), q.rows_refused());
    EXPECT_EQ(p.rows_evicted(), q.rows_evicted());
    EXPECT_EQ(p.rows_expired(), q.rows_expired());
  }
}

}  // namespace pst::replica_testing

#endif  // PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_REPLICA_TESTING_H_
