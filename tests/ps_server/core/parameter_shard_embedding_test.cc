// Embedding rows through one PS shard, without a network: pushed and
// pulled beside the dense variables, under each consistency mode, into
// checkpoints and Stats.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shard_embedding_testing;  // NOLINT(build/namespaces)

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParameterShardEmbeddingTest, SyncRowsAreBitwiseOneWorkersWithTheCombinedBatch) {
  auto reference = MakeShard(Options(SYNC, 1));
  Init(reference.get());
  for (int step = 0; step < 2; ++step) {
    PushResponse response;
    ASSERT_TRUE(Push(*reference, CombinedPush(step), &response).ok());
    ASSERT_EQ(response.outcome(), PushResponse::APPLIED);
  }
  const Pulled expected = PullAll(reference.get(), kAllIds);
  for (const std::vector<int>& order :
       std::vector<std::vector<int>>{{0, 1, 2}, {2, 0, 1}, {1, 2, 0}}) {
    auto shard = MakeShard(Options(SYNC, 3));
    Init(shard.get());
    const Pulled initial = PullAll(shard.get(), kAllIds);
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < order.size(); ++i) {
        const int w = order[i];
        PushResponse response;
        ASSERT_TRUE(
            Push(*shard, RowPush(w, step, kBatches[w], Gradients(w, kBatches[w])), &response).ok());
        const bool last = i + 1 == order.size();
        EXPECT_EQ(response.outcome(), last ? PushResponse::APPLIED : PushResponse::AGGREGATED);
        // The version advances once per step, with its last push.
        EXPECT_EQ(response.version(), last ? step + 1 : step);
        if (step == 0 && !last) {  // nothing is applied before the step completes
          EXPECT_EQ(PullAll(shard.get(), kAllIds).rows, initial.rows);
        }
      }
    }
    const Pulled pulled = PullAll(shard.get(), kAllIds);
    EXPECT_EQ(pulled.version, 2);
    ASSERT_EQ(pulled.rows.size(), expected.rows.size());
    for (size_t i = 0; i < pulled.rows.size(); ++i) {
      // Bitwise, whatever the arrival order.
      EXPECT_EQ(std::memcmp(&pulled.rows[i], &expected.rows[i], sizeof(float)), 0)
          << "element " << i << ": " << pulled.rows[i] << " vs " << expected.rows[i];
    }
    EXPECT_EQ(pulled.dense, expected.dense);
    const StatsResponse stats = [&] {
      StatsResponse s;
      shard->Stats(&s);
      return s;
    }();
    ASSERT_EQ(stats.embeddings_size(), 1);
    EXPECT_EQ(stats.embeddings(0).rows(), static_cast<int64_t>(kAllIds.size()));
    EXPECT_EQ(stats.pushes_applied(), 2);
  }
}

// A row is created on first touch from (seed, table, id) alone: the same
// push gives bitwise the same rows on shard 1 of 2, on a lone shard, on a
// shard started again from nothing, and, for a row first touched after a
// restore, on a shard restored from a checkpoint; another seed gives
// other rows.
TEST(ParameterShardEmbeddingTest, RowsAreCreatedAlikeOnEveryShardCountAndAfterRestarts) {
  std::vector<uint64_t> ids, later;
  for (uint64_t id = 1; later.size() < 3; ++id) {
    if (ShardOfRow(id, 2) != 1) continue;
    (ids.size() < 5 ? ids : later).push_back(id);
  }
  auto trained = [&](const ShardOptions& options) {
    std::unique_ptr<ParameterShard> shard = MakeShard(options);
    Init(shard.get());
    PushResponse response;
    EXPECT_TRUE(Push(*shard, RowPush(0, 0, ids, Gradients(0, ids)), &response).ok());
    return shard;
  };
  std::unique_ptr<ParameterShard> original = trained(Options(ASYNC, 1, 1, 2));
  const std::vector<float> rows = PullAll(original.get(), ids).rows;
  ASSERT_EQ(rows.size(), ids.size() * kDim);
  EXPECT_EQ(PullAll(trained(Options(ASYNC, 1, 0, 1)).get(), ids).rows, rows);
  EXPECT_EQ(PullAll(trained(Options(ASYNC, 1, 1, 2)).get(), ids).rows, rows);
  ShardOptions reseeded = Options(ASYNC, 1, 1, 2);
  reseeded.seed = 12;
  EXPECT_NE(PullAll(trained(reseeded).get(), ids).rows, rows);

  std::unique_ptr<ParameterShard> restored = MakeShard(Options(ASYNC, 1, 1, 2));
  ASSERT_TRUE(restored->Restore(original->Snapshot()).ok());
  const PushRequest next = RowPush(0, 1, later, Gradients(1, later));
  PushResponse response;
  ASSERT_TRUE(Push(*original, next, &response).ok());
  ASSERT_TRUE(Push(*restored, next, &response).ok());
  EXPECT_EQ(PullAll(restored.get(), later).rows, PullAll(original.get(), later).rows);
  EXPECT_EQ(PullAll(restored.get(), ids).rows, rows);
}

// A module's own initial weight (InitRequest.rows): the named rows start
// from it, the others from the table's initial values; a bad seed refuses
// the whole Init.
TEST(ParameterShardEmbeddingTest, AnInitsRowsSeedTheTableAndBadOnesRefuseIt) {
  const auto init_with = [](const std::vector<uint64_t>& ids, const std::vector<float>& rows) {
    InitRequest init;
    EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{0, 0}, init.add_variables());
    EmbeddingTableConfig* table = init.add_embeddings();
    table->set_name("emb");
    table->set_dim(kDim);
    *init.add_rows() = Rows(ids, rows);
    return init;
  };
  auto fresh = MakeShard(Options(SYNC, 1));
  Init(fresh.get());
  const std::vector<float> unseeded = PullAll(fresh.get(), {9}).rows;

  auto shard = MakeShard(Options(SYNC, 1));
  InitResponse response;
  EXPECT_EQ(shard->Init(init_with({3, 3}, std::vector<float>(2 * kDim, 1.0f)), &response).code(),
            absl::StatusCode::kInvalidArgument);  // an id twice
  EXPECT_EQ(shard->Init(init_with({3}, std::vector<float>(kDim - 1, 1.0f)), &response).code(),
            absl::StatusCode::kInvalidArgument);  // short of a row
  EXPECT_EQ(shard->Init(init_with({3}, {1, NAN, 1, 1}), &response).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(shard->initialized());
  ASSERT_TRUE(shard->Init(init_with({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8}), &response).ok());
  const Pulled pulled = PullAll(shard.get(), {4, 9, 3});
  EXPECT_THAT(pulled.rows, ElementsAre(5, 6, 7, 8, unseeded[0], unseeded[1], unseeded[2],
                                       unseeded[3], 1, 2, 3, 4));
  // Seeded rows, never trained, survive a checkpoint.
  auto restored = MakeShard(Options(SYNC, 1));
  ASSERT_TRUE(restored->Restore(shard->Snapshot()).ok());
  EXPECT_EQ(PullAll(restored.get(), {4, 9, 3}).rows, pulled.rows);
}

TEST(ParameterShardEmbeddingTest, ARefusedInitLeavesTheShardUninitializedAndTheNextOneWins) {
  auto shard = MakeShard(Options(ASYNC, 1));
  InitRequest bad_table;
  EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{0, 0}, bad_table.add_variables());
  bad_table.add_embeddings()->set_name("emb");  // dim 0
  InitRequest bad_variable;  // the tables are fine, the dense part is not
  EncodeTensor("", std::vector<int64_t>{2}, std::vector<float>{0, 0},
               bad_variable.add_variables());
  EmbeddingTableConfig* table = bad_variable.add_embeddings();
  table->set_name("other");
  table->set_dim(2);
  for (const InitRequest* init : {&bad_table, &bad_variable}) {
    InitResponse response;
    EXPECT_EQ(shard->Init(*init, &response).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(shard->initialized());
  }
  Init(shard.get());
  StatsResponse stats;
  shard->Stats(&stats);
  ASSERT_EQ(stats.embeddings_size(), 1);
  EXPECT_EQ(stats.embeddings(0).table(), "emb");
  EXPECT_EQ(stats.variables(), 1);
  PushResponse response;
  EXPECT_TRUE(Push(*shard, RowPush(0, 0, {1}, std::vector<float>(kDim, 1)), &response).ok());
}

// ASYNC applies each push on arrival; SSP's rows behave alike.
class RowsOnArrivalTest : public ::testing::TestWithParam<Mode> {};

TEST_P(RowsOnArrivalTest, EachPushAppliesItsRowsAtOnce) {
  auto shard = MakeShard(Options(GetParam(), 2));
  Init(shard.get());
  const Pulled before = PullAll(shard.get(), {5});
  PushResponse first;
  ASSERT_TRUE(Push(*shard, RowPush(0, 0, {5}, {2, 2, 2, 2}), &first).ok());
  EXPECT_EQ(first.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(first.version(), 1);
  const Pulled after_first = PullAll(shard.get(), {5});
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(after_first.rows[k], before.rows[k] - 1.0f);
  PushResponse second;
  ASSERT_TRUE(Push(*shard, RowPush(1, 0, {5}, {4, 4, 4, 4}), &second).ok());
  EXPECT_EQ(second.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(second.version(), 2);
  const Pulled after_second = PullAll(shard.get(), {5});
  for (int k = 0; k < kDim; ++k) {
    EXPECT_FLOAT_EQ(after_second.rows[k], after_first.rows[k] - 2.0f);
  }
  EXPECT_THAT(after_second.dense, ElementsAre(-1.0f, -1.0f));
}

INSTANTIATE_TEST_SUITE_P(AsyncAndSsp, RowsOnArrivalTest, ::testing::Values(ASYNC, SSP));

TEST(ParameterShardEmbeddingTest, APushOfRowsAloneTrainsTheRowsAndLeavesTheDenseVariables) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get());
  const Pulled before = PullAll(shard.get(), {8});
  PushResponse response;
  ASSERT_TRUE(Push(*shard, RowPush(0, 0, {8}, {1, 1, 1, 1}, /*with_dense=*/false), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  const Pulled after = PullAll(shard.get(), {8});
  EXPECT_EQ(after.version, 1);
  EXPECT_THAT(after.dense, ElementsAre(0.0f, 0.0f));
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(after.rows[k], before.rows[k] - 0.5f);
}

TEST(ParameterShardEmbeddingTest, SyncStillWantsEveryDenseGradientBesideTheRows) {
  auto shard = MakeShard(Options(SYNC, 2));
  Init(shard.get());
  PushResponse response;
  const absl::Status status =
      Push(*shard, RowPush(0, 0, {8}, {1, 1, 1, 1}, /*with_dense=*/false), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("missing the gradient for \"b\""));
}

TEST(ParameterShardEmbeddingTest, APushWithNeitherGradientsNorRowsIsRefused) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get());
  PushRequest empty;
  PushResponse response;
  const absl::Status status = Push(*shard, empty, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("no gradients and no embedding rows"));
  EXPECT_EQ(shard->version(), 0);
}

// Third hostile pass: a push naming a table with no ids was APPLIED and
// moved the version (150 a second from one client), forcing checkpoints and
// everyone's staleness up. In ASYNC and SSP it changes nothing now: the
// model and the version stay, and the answer says so.
class EmptyRowPushTest : public ::testing::TestWithParam<Mode> {};

TEST_P(EmptyRowPushTest, APushOfATableWithNoIdsIsNoUpdate) {
  auto shard = MakeShard(Options(GetParam(), 2));
  Init(shard.get());
  const Pulled before = PullAll(shard.get(), {5});
  for (int i = 0; i < 300; ++i) {
    PushResponse response;
    ASSERT_TRUE(Push(*shard, RowPush(0, 0, {}, {}, /*with_dense=*/false), &response).ok());
    ASSERT_EQ(response.outcome(), PushResponse::UNCHANGED) << "push " << i;
    ASSERT_EQ(response.version(), 0);
  }
  EXPECT_EQ(shard->version(), 0);
  // (Worker 1 pulls: under SSP each of them counted on worker 0's clock.)
  const Pulled after = PullAll(shard.get(), {5}, /*worker=*/1);
  EXPECT_EQ(after.rows, before.rows);
  EXPECT_EQ(after.dense, before.dense);
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.pushes_applied(), 0);
  // A push that carries a row is still an update.
  PushResponse response;
  ASSERT_TRUE(Push(*shard, RowPush(1, 0, {5}, {2, 2, 2, 2}, /*with_dense=*/false), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  EXPECT_EQ(shard->version(), 1);
}

INSTANTIATE_TEST_SUITE_P(AsyncAndSsp, EmptyRowPushTest, ::testing::Values(ASYNC, SSP));

TEST(ParameterShardEmbeddingTest, APullOfRowsAtAMinVersionWaitsForTheStep) {
  auto shard = MakeShard(Options(SYNC, 2));
  Init(shard.get());
  const std::vector<float> initial = PullAll(shard.get(), {4}).rows;
  // Worker 0's exchange: push step 0's rows, then pull step 1's ids at
  // version 1.
  PushResponse pushed;
  ASSERT_TRUE(Push(*shard, RowPush(0, 0, {4}, {2, 2, 2, 2}), &pushed).ok());
  ASSERT_EQ(pushed.outcome(), PushResponse::AGGREGATED);
  PullRequest pull;
  pull.set_worker(0);
  pull.set_min_version(1);
  pull.add_names("b");
  *pull.add_rows() = Rows({4, 6});
  std::vector<float> seen;
  int64_t seen_version = -1;
  const ParameterShard::PullVisitor visit =
      [&](int64_t version, const std::vector<const Variable*>&, const PulledRows& rows) {
        seen_version = version;
        PullResponse answer;
        EXPECT_TRUE(rows.AnswerTo(&answer).ok());
        seen.resize(answer.rows(0).data().size() / sizeof(float));
        DecodeValues(answer.rows(0).data(), FLOAT32, seen);
      };
  absl::Notification woken;
  absl::StatusOr<ParameterShard::WaitId> waited =
      shard->PullVisitOrWait(pull, absl::Now() + absl::Seconds(60), visit, [&] { woken.Notify(); });
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_NE(*waited, 0);  // it waits for the step
  EXPECT_EQ(seen_version, -1);
  ASSERT_TRUE(Push(*shard, RowPush(1, 0, {4}, {4, 4, 4, 4}), &pushed).ok());
  ASSERT_EQ(pushed.outcome(), PushResponse::APPLIED);
  ASSERT_TRUE(woken.WaitForNotificationWithTimeout(absl::Seconds(60)));
  waited = shard->PullVisitOrWait(pull, absl::Now() + absl::Seconds(60), visit, [] {});
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, 0);
  EXPECT_EQ(seen_version, 1);
  ASSERT_EQ(seen.size(), 2u * kDim);
  // Row 4 moved by lr 0.5 times the mean gradient 3; row 6 was never
  // pushed and reads as its initial value.
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(seen[k], initial[k] - 1.5f);
  const std::vector<float> six = PullAll(shard.get(), {6}).rows;
  EXPECT_EQ(std::vector<float>(seen.begin() + kDim, seen.end()), six);
}

TEST(ParameterShardEmbeddingTest, ACheckpointThroughTheShardKeepsTheRows) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get(), /*max_rows=*/2);
  PushResponse response;
  ASSERT_TRUE(
      Push(*shard, RowPush(0, 0, {1, 2, 3}, std::vector<float>(3 * kDim, 1)), &response).ok());
  const Pulled before = PullAll(shard.get(), {1, 2, 3});
  const ShardCheckpoint checkpoint = shard->Snapshot();
  ASSERT_EQ(checkpoint.embeddings_size(), 1);

  auto restored = MakeShard(Options(ASYNC, 1));
  ASSERT_TRUE(restored->Restore(checkpoint).ok());
  EXPECT_TRUE(restored->initialized());
  EXPECT_EQ(restored->parameter_bytes(), shard->parameter_bytes());
  const Pulled after = PullAll(restored.get(), {1, 2, 3});
  EXPECT_EQ(after.version, before.version);
  EXPECT_EQ(after.rows, before.rows);
  StatsResponse stats;
  restored->Stats(&stats);
  ASSERT_EQ(stats.embeddings_size(), 1);
  EXPECT_EQ(stats.embeddings(0).rows(), 2);
  EXPECT_EQ(stats.embeddings(0).rows_admitted(), 2);
  EXPECT_EQ(stats.embeddings(0).rows_refused(), 1);
  // The restored rows train on.
  ASSERT_TRUE(Push(*restored, RowPush(0, 1, {1}, {2, 2, 2, 2}), &response).ok());
  const Pulled trained = PullAll(restored.get(), {1});
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(trained.rows[k], before.rows[k] - 1.0f);
}

// A scheduled snapshot holds the rows of its version, however many pushes
// applied before its writer took it.
TEST(ParameterShardEmbeddingTest, AScheduledSnapshotHoldsTheRowsOfItsVersion) {
  ShardOptions options = Options(ASYNC, 1);
  options.snapshot_every_steps = 2;
  auto shard = MakeShard(options);
  Init(shard.get());
  PushResponse response;
  for (int64_t version = 0; version < 2; ++version) {
    ASSERT_TRUE(
        Push(*shard, RowPush(0, version, {1, 2}, std::vector<float>(2 * kDim, 1)), &response).ok());
  }
  const Pulled at_two = PullAll(shard.get(), {1, 2, 3});
  ASSERT_EQ(at_two.version, 2);
  ASSERT_TRUE(
      Push(*shard, RowPush(0, 2, {1, 3}, std::vector<float>(2 * kDim, 4)), &response).ok());
  const Pulled at_three = PullAll(shard.get(), {1, 2, 3});

  std::optional<ShardCheckpoint> snapshot = shard->TakeScheduledSnapshot(absl::Now());
  ASSERT_TRUE(snapshot.has_value());
  EXPECT_EQ(snapshot->version(), 2);
  auto restored = MakeShard(Options(ASYNC, 1));
  ASSERT_TRUE(restored->Restore(*snapshot).ok());
  EXPECT_EQ(PullAll(restored.get(), {1, 2, 3}).rows, at_two.rows);
  EXPECT_EQ(PullAll(shard.get(), {1, 2, 3}).rows, at_three.rows);
}

TEST(ParameterShardEmbeddingTest, StatsCountRowsAdmittedAndRefusedAtTheLimit) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get(), /*max_rows=*/2);
  const int64_t dense_bytes = shard->parameter_bytes();
  EXPECT_EQ(dense_bytes, 2 * static_cast<int64_t>(sizeof(float)));
  const Pulled initial = PullAll(shard.get(), {1, 2, 3});
  PushResponse response;
  ASSERT_TRUE(
      Push(*shard, RowPush(0, 0, {1, 2, 3}, std::vector<float>(3 * kDim, 1)), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
  StatsResponse stats;
  shard->Stats(&stats);
  ASSERT_EQ(stats.embeddings_size(), 1);
  const EmbeddingTableStats& table = stats.embeddings(0);
  EXPECT_EQ(table.table(), "emb");
  EXPECT_EQ(table.dim(), kDim);
  EXPECT_EQ(table.rows(), 2);
  EXPECT_EQ(table.rows_admitted(), 2);
  EXPECT_EQ(table.rows_refused(), 1);
  EXPECT_GT(table.bytes(), 0);
  // The shard's parameter bytes grow with the rows, at once.
  const int64_t rows_bytes = 2 * kDim * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(stats.parameter_bytes(), dense_bytes + rows_bytes);
  EXPECT_EQ(shard->parameter_bytes(), dense_bytes + rows_bytes);
  // The refused row kept its initial value; the others trained.
  const Pulled after = PullAll(shard.get(), {1, 2, 3});
  for (int k = 0; k < kDim; ++k) {
    EXPECT_FLOAT_EQ(after.rows[k], initial.rows[k] - 0.5f);
    EXPECT_FLOAT_EQ(after.rows[kDim + k], initial.rows[kDim + k] - 0.5f);
    EXPECT_EQ(after.rows[2 * kDim + k], initial.rows[2 * kDim + k]);
  }
}

// Third hostile pass: one client filled the table in 4 s and every id the
// job met afterwards was refused for the rest of the run. A full table
// now evicts its least recently updated rows: a flood of new ids from one
// worker churns through its own old rows while the job's rows, updated
// every step, stay trained; each update evicts at most its share.
TEST(ParameterShardEmbeddingTest, AFullTableEvictsItsLeastRecentlyUsedRowsForNewIds) {
  constexpr int64_t kMaxRows = 4096;
  constexpr int64_t kShare = kMaxRows / (8 * 2);  // EvictionsPerUpdate, 2 workers
  auto shard = MakeShard(Options(ASYNC, 2));
  Init(shard.get(), kMaxRows);
  const std::vector<uint64_t> job = {1, 2, 3};
  const Pulled initial = PullAll(shard.get(), job);
  std::vector<float> expected = initial.rows;
  auto job_step = [&] {
    PushResponse response;
    ASSERT_TRUE(Push(*shard, RowPush(0, shard->version(), job, std::vector<float>(3 * kDim, 1),
                                     /*with_dense=*/false),
                     &response)
                    .ok());
    ASSERT_EQ(response.outcome(), PushResponse::APPLIED);
    for (float& x : expected) x -= 0.5f;
  };
  uint64_t next_flood_id = 1000;
  auto flood = [&](int64_t ids) {
    std::vector<uint64_t> batch;
    for (int64_t i = 0; i < ids; ++i) batch.push_back(next_flood_id++);
    PushResponse response;
    ASSERT_TRUE(Push(*shard,
                     RowPush(1, shard->version(), batch,
                             std::vector<float>(batch.size() * kDim, 1), /*with_dense=*/false),
                     &response)
                    .ok());
  };
  // The flood fills the table while the job trains.
  for (int64_t filled = 0; filled < kMaxRows; filled += kShare) {
    ASSERT_NO_FATAL_FAILURE(flood(kShare));
    ASSERT_NO_FATAL_FAILURE(job_step());
  }
  // Then keeps flooding: 5 tables' worth of new ids.
  for (int i = 0; i < 5 * kMaxRows / kShare; ++i) {
    ASSERT_NO_FATAL_FAILURE(flood(kShare));
    ASSERT_NO_FATAL_FAILURE(job_step());
  }
  StatsResponse stats;
  shard->Stats(&stats);
  ASSERT_EQ(stats.embeddings_size(), 1);
  EXPECT_EQ(stats.embeddings(0).rows(), kMaxRows);
  EXPECT_EQ(stats.embeddings(0).rows_refused(), 0);
  EXPECT_GE(stats.embeddings(0).rows_evicted(), 5 * kMaxRows - 3);
  // The job's rows were never evicted: they hold every update.
  EXPECT_EQ(PullAll(shard.get(), job).rows, expected);

  // A job's new id is still admitted.
  PushResponse response;
  ASSERT_TRUE(Push(*shard, RowPush(0, shard->version(), {7}, {1, 1, 1, 1}, /*with_dense=*/false),
                   &response)
                  .ok());
  const Pulled seven = PullAll(shard.get(), {7});
  const Pulled seven_initial = [&] {
    auto fresh = MakeShard(Options(ASYNC, 2));
    Init(fresh.get(), kMaxRows);
    return PullAll(fresh.get(), {7});
  }();
  for (int k = 0; k < kDim; ++k) EXPECT_FLOAT_EQ(seven.rows[k], seven_initial.rows[k] - 0.5f);

  // One push of more new ids than its share evicts its share and refuses
  // the rest.
  const int64_t evicted_before = [&] {
    StatsResponse s;
    shard->Stats(&s);
    return s.embeddings(0).rows_evicted();
  }();
  ASSERT_NO_FATAL_FAILURE(flood(3 * kShare));
  stats.Clear();
  shard->Stats(&stats);
  EXPECT_EQ(stats.embeddings(0).rows_evicted() - evicted_before, kShare);
  EXPECT_EQ(stats.embeddings(0).rows_refused(), 2 * kShare);

  // The counters travel with a checkpoint.
  ShardCheckpoint checkpoint = shard->Snapshot();
  auto restored = MakeShard(Options(ASYNC, 2));
  ASSERT_TRUE(restored->Restore(checkpoint).ok());
  StatsResponse restored_stats;
  restored->Stats(&restored_stats);
  EXPECT_EQ(restored_stats.embeddings(0).rows_evicted(), stats.embeddings(0).rows_evicted());
  EXPECT_EQ(restored_stats.embeddings(0).rows(), kMaxRows);
}

// REFUSE_NEW_ROWS keeps a full table's rows: new ones are refused, counted.
TEST(ParameterShardEmbeddingTest, AFullTableThatRefusesKeepsItsRows) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get(), /*max_rows=*/2, EmbeddingTableConfig::REFUSE_NEW_ROWS);
  PushResponse response;
  ASSERT_TRUE(Push(*shard, RowPush(0, 0, {1, 2}, std::vector<float>(2 * kDim, 1)), &response).ok());
  ASSERT_TRUE(Push(*shard, RowPush(0, 1, {3}, std::vector<float>(kDim, 1)), &response).ok());
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.embeddings(0).rows(), 2);
  EXPECT_EQ(stats.embeddings(0).rows_refused(), 1);
  EXPECT_EQ(stats.embeddings(0).rows_evicted(), 0);
}

// A shard may hold rows and no dense variable (a model's few dense
// variables lie on other shards); an Init with neither is still refused.
TEST(ShardOfRowsOnlyTest, InitsWithTablesAloneAndTrainsRows) {
  std::unique_ptr<ParameterShard> shard = MakeShard(Options(SYNC, 1));
  InitRequest nothing;
  InitResponse response;
  const absl::Status refused = shard->Init(nothing, &response);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("no variables and no embedding tables"));

  InitRequest tables;
  EmbeddingTableConfig* table = tables.add_embeddings();
  table->set_name("emb");
  table->set_dim(kDim);
  ASSERT_TRUE(shard->Init(tables, &response).ok());
  EXPECT_TRUE(response.accepted());
  const std::vector<uint64_t> ids = {7, 8};
  PushResponse pushed;
  ASSERT_TRUE(
      Push(*shard, RowPush(0, 0, ids, Gradients(0, ids), /*with_dense=*/false), &pushed).ok());
  EXPECT_EQ(pushed.outcome(), PushResponse::APPLIED);

  // A pull of rows only answers no variable, whatever the shard holds.
  PullRequest pull;
  pull.set_worker(0);
  pull.set_rows_only(true);
  *pull.add_rows() = Rows(ids);
  PullResponse answer;
  ASSERT_TRUE(Pull(*shard, pull, absl::Now(), &answer).ok());
  EXPECT_EQ(answer.version(), 1);
  EXPECT_EQ(answer.variables_size(), 0);
  ASSERT_EQ(answer.rows_size(), 1);
  EXPECT_EQ(answer.rows(0).data().size(), ids.size() * kDim * sizeof(float));
  pull.add_names("b");
  EXPECT_TRUE(absl::IsInvalidArgument(Pull(*shard, pull, absl::Now(), &answer)));
}

TEST(ShardOfRowsOnlyTest, ARowsOnlyPullOfAShardWithVariablesAnswersRowsAlone) {
  std::unique_ptr<ParameterShard> shard = MakeShard(Options(ASYNC, 1));
  ASSERT_NO_FATAL_FAILURE(Init(shard.get()));
  PullRequest pull;
  pull.set_worker(0);
  pull.set_rows_only(true);
  *pull.add_rows() = Rows({1, 2, 3});
  PullResponse answer;
  ASSERT_TRUE(Pull(*shard, pull, absl::Now(), &answer).ok());
  EXPECT_EQ(answer.variables_size(), 0);
  ASSERT_EQ(answer.rows_size(), 1);
  EXPECT_EQ(answer.rows(0).data().size(), 3 * kDim * sizeof(float));
}

}  // namespace PST_FILE_ID
}  // namespace pst
