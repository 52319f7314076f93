// The embedding tables' SYNC step (the rank-ordered mean, bitwise the same in
// any arrival order) and their row limit.
#include "ps_server/core/embedding_table.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <latch>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/embedding_config.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/embedding_init.h"
#include "tests/ps_server/core/embedding_table_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace embedding_testing;  // NOLINT(build/namespaces)

// --- The SYNC step ---

// Values whose float sums depend on the order of the additions: id 1's
// first element sums to 1 in rank order, to 0 in some others.
std::vector<PushRequest> StepPushes() {
  return {
      Push({Rows("a", {1, 2}, {1e8f, 1, 0.1f, 3})}, 0),
      Push({Rows("a", {2, 3, 1}, {0.7f, -1, 5, 5, -1e8f, 0.25f}), Rows("b", {1}, {2})}, 1),
      Push({Rows("a", {1, 3}, {1, 1e-3f, 0.3f, 1e7f})}, 2),
  };
}

TEST(EmbeddingTableTest, TheSyncStepAppliesTheRankOrderedMeanOnce) {
  std::unique_ptr<EmbeddingTable> table =
      Make({Spec("a", 2, Sgd(1.0f)), Spec("b", 1, Sgd(1.0f))}, Options(0, 1, 3));
  const std::vector<PushRequest> pushes = StepPushes();
  for (int rank = 0; rank < 3; ++rank) {
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
    table->Land(rank, pushes[rank], plan);
  }
  ASSERT_TRUE(table->StageStep({}).ok());
  EXPECT_EQ(StatsOf(*table, "a").rows(), 0);  // staged, not committed
  table->Commit();
  // Per id: (0 + g_0 + g_1 + g_2) * (1/3), ranks without the id adding nothing.
  const float third = 1.0f / 3.0f;
  auto mean = [third](float a, float b, float c = 0) { return (0.0f + a + b + c) * third; };
  ASSERT_EQ(-mean(1e8f, -1e8f, 1), -third);
  EXPECT_EQ(Lookup(*table, "a", {1, 2, 3}),
            (std::vector<float>{-mean(1e8f, -1e8f, 1), -mean(1, 0.25f, 1e-3f), -mean(0.1f, 0.7f),
                                -mean(3, -1), -mean(5, 0.3f), -mean(5, 1e7f)}));
  EXPECT_EQ(Lookup(*table, "b", {1}), std::vector<float>{-(0.0f + 2) * third});
  EXPECT_EQ(Exported(*table).embeddings(0).updates(), 1);
  // The step is empty again: a step with one rank divides by one.
  TablePush plan;
  const PushRequest one = Push({Rows("b", {1}, {3})});
  ASSERT_TRUE(table->CheckPush(one, true, true, &plan).ok());
  table->Land(0, one, plan);
  ASSERT_TRUE(table->StageStep({}).ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "b", {1}), std::vector<float>{-(0.0f + 2) * third - 3});
}

TEST(EmbeddingTableTest, TheSyncStepIsBitwiseTheSameInEveryArrivalOrder) {
  const std::vector<PushRequest> pushes = StepPushes();
  std::string reference;
  std::vector<int> order = {0, 1, 2};
  do {
    SCOPED_TRACE(testing::Message() << order[0] << order[1] << order[2]);
    std::unique_ptr<EmbeddingTable> table =
        Make({Spec("a", 2, Adam(0.01f), 0, 1.0f), Spec("b", 1, Adam(0.01f))}, Options(0, 1, 3));
    for (int rank : order) {
      TablePush plan;
      ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
      table->Land(rank, pushes[rank], plan);
    }
    ASSERT_TRUE(table->StageStep({}).ok());
    table->Commit();
    if (reference.empty()) reference = Snapshot(*table);
    EXPECT_EQ(Snapshot(*table), reference);
  } while (std::next_permutation(order.begin(), order.end()));

  // And with the ranks landing at once on their own threads.
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<EmbeddingTable> table =
        Make({Spec("a", 2, Adam(0.01f), 0, 1.0f), Spec("b", 1, Adam(0.01f))}, Options(0, 1, 3));
    std::vector<TablePush> plans(3);
    for (int rank = 0; rank < 3; ++rank) {
      ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plans[rank]).ok());
    }
    std::latch start(3);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 3; ++rank) {
      ranks.emplace_back([&, rank] {
        start.arrive_and_wait();
        table->Land(rank, pushes[rank], plans[rank]);
      });
    }
    for (std::thread& t : ranks) t.join();
    ASSERT_TRUE(table->StageStep({}).ok());
    table->Commit();
    EXPECT_EQ(Snapshot(*table), reference);
  }
}

TEST(EmbeddingTableTest, TheSyncMeanDividesByTheRanksThatLanded) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(1.0f))}, Options(0, 1, 4));
  for (int rank : {3, 1}) {
    const PushRequest push = Push({Rows("a", {1}, {static_cast<float>(rank)})}, rank);
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
    table->Land(rank, push, plan);
  }
  // A landed rank with no rows still counts.
  const PushRequest empty = Push({}, 0);
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(empty, true, true, &plan).ok());
  table->Land(0, empty, plan);
  ASSERT_TRUE(table->StageStep({}).ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "a", {1}), std::vector<float>{-(0.0f + 1 + 3) * (1.0f / 3)});
}

TEST(EmbeddingTableTest, AFailedSyncStepIsEmptiedAndDiscardable) {
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(10.0f))}, Options(0, 1, 2));
  const std::string before = Snapshot(*table);
  for (int rank = 0; rank < 2; ++rank) {
    const PushRequest push = Push({Rows("a", {1, 2}, {1, 3e38f})}, rank);
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
    table->Land(rank, push, plan);
  }
  absl::Status status = table->StageStep({});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("id 2 "));
  table->Discard();
  EXPECT_EQ(Snapshot(*table), before);
  // The next step starts empty.
  ASSERT_TRUE(table->StageStep({}).ok());
  table->Commit();
  EXPECT_EQ(Snapshot(*table), before);
}

// --- Rows found by the ranks' pulls ---

// Answers worker `rank`'s pull of `ids` from every table of `tables`.
void PullAs(const EmbeddingTable& table, int rank, const std::vector<uint64_t>& ids,
            const std::vector<std::string>& tables) {
  PullRequest pull;
  pull.set_worker(rank);
  for (const std::string& name : tables) {
    EmbeddingRows* rows = pull.add_rows();
    rows->set_table(name);
    rows->set_ids(IdBytes(ids));
  }
  PullResponse answer;
  ASSERT_TRUE(table.AnswerPull(pull, &answer).ok());
}

// Lands each rank's push of `ids[rank]` to every table of `dims` (name ->
// dim) and stages and commits the step.
void SyncStep(EmbeddingTable& table, const std::vector<std::vector<uint64_t>>& ids,
              const std::vector<std::pair<std::string, int>>& dims, int step) {
  for (size_t rank = 0; rank < ids.size(); ++rank) {
    std::vector<EmbeddingRows> parts;
    for (const auto& [name, dim] : dims) {
      parts.push_back(Rows(name, ids[rank], Gradients(ids[rank], dim, step + int(rank))));
    }
    const PushRequest push = Push(std::move(parts), static_cast<int>(rank));
    TablePush plan;
    ASSERT_TRUE(table.CheckPush(push, true, true, &plan).ok());
    table.Land(static_cast<int>(rank), push, plan);
  }
  ASSERT_TRUE(table.StageStep({}).ok());
  table.Commit();
}

TEST(EmbeddingTableTest, ASyncStepStagesTheRowsItsRanksPulledAsALookupWould) {
  const std::vector<std::pair<std::string, int>> dims = {{"a", 2}, {"b", 1}};
  const std::vector<EmbeddingTableConfig> specs = {Spec("a", 2, Adagrad(0.1f, 0.01f), 0, 0.05f),
                                                   Spec("b", 1, Adagrad(0.1f, 0.01f))};
  std::unique_ptr<EmbeddingTable> pulled = Make(specs, Options(0, 1, 2));
  std::unique_ptr<EmbeddingTable> looked_up = Make(specs, Options(0, 1, 2));
  // Each step: ids both ranks name, ids one rank names, new ids and old.
  const std::vector<std::vector<std::vector<uint64_t>>> steps = {
      {{1, 2, 3}, {3, 4}},
      {{4, 1, 5}, {6, 1}},
      {{7, 2}, {2, 7, 8, 5}},
      {{}, {9, 1}},
  };
  int64_t union_rows = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s);
    for (int rank = 0; rank < 2; ++rank) PullAs(*pulled, rank, steps[s][rank], {"a", "b"});
    SyncStep(*pulled, steps[s], dims, static_cast<int>(s));
    SyncStep(*looked_up, steps[s], dims, static_cast<int>(s));
    ASSERT_EQ(Snapshot(*pulled), Snapshot(*looked_up));
    absl::flat_hash_set<uint64_t> ids(steps[s][0].begin(), steps[s][0].end());
    ids.insert(steps[s][1].begin(), steps[s][1].end());
    union_rows += 2 * static_cast<int64_t>(ids.size());  // both tables
  }
  EXPECT_EQ(pulled->rows_staged_as_pulled(), union_rows);
  EXPECT_EQ(looked_up->rows_staged_as_pulled(), 0);
}

TEST(EmbeddingTableTest, RowsMovedOrAddedSinceThePullAreLookedUpAgain) {
  // Three rows at most, evicting: an update of a new id drops a row and
  // moves the last one into its place.
  const std::vector<EmbeddingTableConfig> specs = {Spec("a", 1, Sgd(1.0f), 3)};
  std::unique_ptr<EmbeddingTable> pulled = Make(specs, Options(0, 1, 2));
  std::unique_ptr<EmbeddingTable> looked_up = Make(specs, Options(0, 1, 2));
  auto both = [&](const PushRequest& push) {
    ASSERT_TRUE(Apply(*pulled, push).ok());
    ASSERT_TRUE(Apply(*looked_up, push).ok());
  };
  both(Push({Rows("a", {10, 11, 12}, {1, 2, 3})}));
  both(Push({Rows("a", {10, 11}, {1, 1})}));  // 12 is the least recent
  // Rank 0 finds 11 and 10 in RAM and 20 not at all; then 12 is evicted
  // (a row moves into its place) and 20 is added.
  PullAs(*pulled, 0, {11, 10, 20}, {"a"});
  both(Push({Rows("a", {20}, {5})}));
  ASSERT_EQ(Lookup(*looked_up, "a", {12}), std::vector<float>{0});
  SyncStep(*pulled, {{11, 10, 20}, {}}, {{"a", 1}}, 0);
  SyncStep(*looked_up, {{11, 10, 20}, {}}, {{"a", 1}}, 0);
  EXPECT_EQ(Snapshot(*pulled), Snapshot(*looked_up));
  EXPECT_EQ(StatsOf(*pulled, "a").rows(), 3);
  EXPECT_EQ(pulled->rows_staged_as_pulled(), 0);

  // A pull of other ids (or another worker's) is not the push's.
  PullAs(*pulled, 0, {10, 11}, {"a"});
  PullAs(*pulled, 1, {20, 11}, {"a"});
  SyncStep(*pulled, {{11, 10}, {}}, {{"a", 1}}, 1);
  SyncStep(*looked_up, {{11, 10}, {}}, {{"a", 1}}, 1);
  EXPECT_EQ(Snapshot(*pulled), Snapshot(*looked_up));
  EXPECT_EQ(pulled->rows_staged_as_pulled(), 0);
}

// --- The row limit ---

TEST(EmbeddingTableTest, PastTheRowLimitNewRowsAreRefusedAndCountedWhileOldOnesTrain) {
  std::unique_ptr<EmbeddingTable> table = Make({Refusing(Spec("a", 1, Sgd(1.0f), 3))});
  ASSERT_TRUE(Apply(*table, Push({Rows("a", {10, 11, 12, 13, 14}, {1, 1, 1, 1, 1})})).ok());
  EXPECT_EQ(Lookup(*table, "a", {10, 11, 12, 13, 14}), (std::vector<float>{-1, -1, -1, 0, 0}));
  EmbeddingTableStats stats = StatsOf(*table, "a");
  EXPECT_EQ(stats.rows(), 3);
  EXPECT_EQ(stats.rows_admitted(), 3);
  EXPECT_EQ(stats.rows_refused(), 2);

  // A discarded update counts nothing.
  const PushRequest push = Push({Rows("a", {15, 10}, {1, 1})});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, false, true, &plan).ok());
  ASSERT_TRUE(table->Stage(push, plan, {}).ok());
  table->Discard();
  EXPECT_EQ(StatsOf(*table, "a").rows_refused(), 2);

  ASSERT_TRUE(Apply(*table, push).ok());
  EXPECT_EQ(Lookup(*table, "a", {10, 15}), (std::vector<float>{-2, 0}));
  stats = StatsOf(*table, "a");
  EXPECT_EQ(stats.rows(), 3);
  EXPECT_EQ(stats.rows_admitted(), 3);
  EXPECT_EQ(stats.rows_refused(), 3);
}

TEST(EmbeddingTableTest, TheSyncStepAdmitsRowsInRankOrderUpToTheLimit) {
  std::unique_ptr<EmbeddingTable> table =
      Make({Refusing(Spec("a", 1, Sgd(1.0f), 2))}, Options(0, 1, 2));
  const PushRequest pushes[] = {Push({Rows("a", {7, 5}, {2, 2})}, 0),
                                Push({Rows("a", {9, 7}, {2, 2})}, 1)};
  for (int rank : {1, 0}) {
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
    table->Land(rank, pushes[rank], plan);
  }
  ASSERT_TRUE(table->StageStep({}).ok());
  table->Commit();
  EXPECT_EQ(Lookup(*table, "a", {7, 5, 9}), (std::vector<float>{-2, -1, 0}));
  EXPECT_EQ(StatsOf(*table, "a").rows_refused(), 1);
}

// Evicting or refusing, a stream of one-off ids never takes the table past
// its limit.
class RowLimitTest : public ::testing::TestWithParam<EmbeddingTableConfig::WhenFull> {};

TEST_P(RowLimitTest, AStreamOfOneOffIdsStaysWithinTheRowLimit) {
  EmbeddingTableConfig spec = Spec("a", 8, Adagrad(0.1f, 0.1f), 1000);
  spec.set_when_full(GetParam());
  std::unique_ptr<EmbeddingTable> table = Make({spec});
  std::vector<uint64_t> ids(500);
  std::vector<float> g(ids.size() * 8, 0.5f);
  for (int batch = 0; batch < 40; ++batch) {
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = (uint64_t{1} << 40) | (batch * ids.size() + i);
    ASSERT_TRUE(Apply(*table, Push({Rows("a", ids, g)})).ok());
  }
  const EmbeddingTableStats stats = StatsOf(*table, "a");
  EXPECT_EQ(stats.rows(), 1000);
  if (GetParam() == EmbeddingTableConfig::REFUSE_NEW_ROWS) {
    EXPECT_EQ(stats.rows_admitted(), 1000);
    EXPECT_EQ(stats.rows_refused(), 19000);
    EXPECT_EQ(stats.rows_evicted(), 0);
  } else {
    // Once full, each batch of 500 new ids evicts its share of the table
    // (1000 / 8 for one worker) and the rest are refused.
    EXPECT_EQ(stats.rows_admitted(), 1000 + 38 * 125);
    EXPECT_EQ(stats.rows_refused(), 38 * 375);
    EXPECT_EQ(stats.rows_evicted(), 38 * 125);
  }
  // Values, state (one accumulator per value), id, count and tick per row,
  // a block at most of slack, and the index.
  const int64_t raw = 1000 * (8 * 4 * 2 + 24);
  EXPECT_GE(stats.bytes(), raw);
  EXPECT_LE(stats.bytes(), raw + RowStore::kRowsPerBlock * (8 * 4 * 2 + 24) + 1000 * 64);
}

INSTANTIATE_TEST_SUITE_P(EvictOrRefuse, RowLimitTest,
                         ::testing::Values(EmbeddingTableConfig::EVICT_LEAST_RECENTLY_USED,
                                           EmbeddingTableConfig::REFUSE_NEW_ROWS));

// A SYNC step that evicts evicts the same rows on every run (the draws are
// a fixed sequence per table), so SYNC stays bitwise reproducible, and
// never a row the step trains.
TEST(EmbeddingTableTest, EvictionsAreTheSameOnEveryRunAndSpareTheStepsRows) {
  auto run = [] {
    std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 1, Sgd(1.0f), 64)}, Options(0, 1, 2));
    for (uint64_t step = 0; step < 20; ++step) {
      std::vector<uint64_t> ids;
      for (uint64_t i = 0; i < 16; ++i) ids.push_back(step * 16 + i);
      const PushRequest pushes[] = {Push({Rows("a", ids, std::vector<float>(16, 1))}, 0),
                                    Push({Rows("a", {1000, 1001}, {1, 1})}, 1)};
      for (int rank : {0, 1}) {
        TablePush plan;
        EXPECT_TRUE(table->CheckPush(pushes[rank], true, true, &plan).ok());
        table->Land(rank, pushes[rank], plan);
      }
      EXPECT_TRUE(table->StageStep({}).ok());
      table->Commit();
    }
    std::vector<uint64_t> all;
    for (uint64_t id = 0; id < 20 * 16; ++id) all.push_back(id);
    all.push_back(1000);
    all.push_back(1001);
    return std::make_pair(Lookup(*table, "a", all), StatsOf(*table, "a"));
  };
  const auto [first, stats] = run();
  EXPECT_EQ(run().first, first);
  EXPECT_EQ(stats.rows(), 64);
  EXPECT_EQ(stats.rows_evicted(), 20 * 16 + 2 - 64);
  // Rows 1000 and 1001, trained every step, were never evicted: 20 steps
  // of a mean gradient of 0.5.
  EXPECT_EQ(first[first.size() - 2], -10.0f);
  EXPECT_EQ(first[first.size() - 1], -10.0f);
}

TEST(EmbeddingTableTest, RowsSpanningManyBlocksKeepTheirOwnValuesAndState) {
  const int rows = 3 * static_cast<int>(RowStore::kRowsPerBlock) + 17;
  std::unique_ptr<EmbeddingTable> table = Make({Spec("a", 3, Sgd(1.0f, 0.5f))});
  std::vector<uint64_t> ids(rows);
  std::vector<float> g(rows * 3);
  for (int i = 0; i < rows; ++i) {
    ids[i] = uint64_t{0x9e3779b97f4a7c15} * (i + 1);  // scattered over the id space
    for (int e = 0; e < 3; ++e) g[i * 3 + e] = static_cast<float>(i % 1000) + 0.25f * e;
  }
  // Two halves, then everything again: rows are added across blocks and
  // then updated in place with momentum (v = g, then 0.5 g + g).
  auto rows_of = [&](int first, int last) {
    return Rows("a", std::vector<uint64_t>(ids.begin() + first, ids.begin() + last),
                std::vector<float>(g.begin() + first * 3, g.begin() + last * 3));
  };
  ASSERT_TRUE(Apply(*table, Push({rows_of(0, rows / 2)})).ok());
  ASSERT_TRUE(Apply(*table, Push({rows_of(rows / 2, rows)})).ok());
  ASSERT_TRUE(Apply(*table, Push({rows_of(0, rows)})).ok());
  std::vector<float> expected(g.size());
  for (size_t i = 0; i < g.size(); ++i) expected[i] = -g[i] - (0.5f * g[i] + g[i]);
  EXPECT_EQ(Lookup(*table, "a", ids), expected);
  EXPECT_EQ(StatsOf(*table, "a").rows(), rows);
  EmbeddingTable restored(Options());
  ASSERT_TRUE(restored.Restore(Exported(*table)).ok());
  EXPECT_EQ(Lookup(restored, "a", ids), expected);
  EXPECT_EQ(Snapshot(restored), Snapshot(*table));
}

}  // namespace PST_FILE_ID
}  // namespace pst
