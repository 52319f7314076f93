// The Table contract (ps_server/core/table.h), as the dense variables keep it:
// checks that change nothing, updates that are all or nothing, the SYNC
// step's rank-ordered mean, checkpoints that round-trip, and Stats.
#include "ps_server/core/dense_table.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

constexpr float kLearningRate = 0.5f;

std::unique_ptr<Table> SgdTable(int workers) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(kLearningRate);
  return std::make_unique<DenseTable>(std::move(*MakeOptimizer(config)), workers);
}

InitRequest InitOf(const std::vector<float>& a, const std::vector<float>& b) {
  InitRequest init;
  EncodeTensor("a", std::vector<int64_t>{static_cast<int64_t>(a.size())}, a,
               init.add_variables());
  EncodeTensor("b", std::vector<int64_t>{static_cast<int64_t>(b.size())}, b,
               init.add_variables());
  return init;
}

PushRequest PushOf(int worker, const std::vector<float>& a, const std::vector<float>& b) {
  PushRequest push;
  push.set_worker(worker);
  EncodeTensor("a", std::vector<int64_t>{static_cast<int64_t>(a.size())}, a,
               push.add_gradients());
  EncodeTensor("b", std::vector<int64_t>{static_cast<int64_t>(b.size())}, b,
               push.add_gradients());
  return push;
}

// The table's values, variable by variable, as a checkpoint holds them.
std::vector<std::vector<float>> ValuesOf(const Table& table) {
  ShardCheckpoint checkpoint;
  table.Export(&checkpoint);
  std::vector<std::vector<float>> values;
  for (const ShardCheckpoint::Variable& v : checkpoint.variables()) {
    std::vector<float> out(v.values().size() / sizeof(float));
    std::memcpy(out.data(), v.values().data(), v.values().size());
    values.push_back(std::move(out));
  }
  return values;
}

TEST(DenseTableTest, InitializeGivesTheTableItsVariablesAndStatsCountThem) {
  std::unique_ptr<Table> table = SgdTable(1);
  EXPECT_FALSE(table->initialized());
  ASSERT_TRUE(table->Initialize(InitOf({1, 2, 3}, {4})).ok());
  EXPECT_TRUE(table->initialized());
  EXPECT_EQ(table->parameter_bytes(), 4 * static_cast<int64_t>(sizeof(float)));
  StatsResponse stats;
  stats.set_variables(1);  // another table's
  stats.set_parameter_bytes(100);
  table->AddStats(&stats);
  EXPECT_EQ(stats.variables(), 3);
  EXPECT_EQ(stats.parameter_bytes(), 116);
}

TEST(DenseTableTest, AMalformedInitLeavesTheTableEmpty) {
  std::unique_ptr<Table> table = SgdTable(1);
  InitRequest init = InitOf({1, 2}, {3});
  init.mutable_variables(1)->set_name("a");  // twice
  EXPECT_EQ(table->Initialize(init).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(table->initialized());
  EXPECT_EQ(table->parameter_bytes(), 0);
}

TEST(DenseTableTest, CheckPushRefusesEachMalformedPartAndNamesIt) {
  std::unique_ptr<Table> table = SgdTable(1);
  ASSERT_TRUE(table->Initialize(InitOf({1, 2}, {3})).ok());
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* what;
    PushRequest push;
    bool require_all;
    const char* named;
  };
  PushRequest unknown = PushOf(0, {1, 1}, {1});
  unknown.mutable_gradients(1)->set_name("c");
  PushRequest only_a;
  only_a.set_worker(0);
  EncodeTensor("a", std::vector<int64_t>{2}, std::vector<float>{1, 1}, only_a.add_gradients());
  const std::vector<Case> cases = {
      {"unknown variable", unknown, false, "\"c\""},
      {"wrong size", PushOf(0, {1, 1, 1}, {1}), false, "\"a\""},
      {"non-finite", PushOf(0, {1, inf}, {1}), false, "\"a\""},
      {"a variable missing where all must be", only_a, true, "\"b\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TablePush plan;
    const absl::Status status = table->CheckPush(c.push, c.require_all, true, &plan);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(c.named), absl::string_view::npos) << status.message();
  }
  TablePush plan;
  EXPECT_TRUE(table->CheckPush(only_a, false, true, &plan).ok());
  EXPECT_EQ(plan.indices, std::vector<int>{0});
  EXPECT_EQ(ValuesOf(*table), (std::vector<std::vector<float>>{{1, 2}, {3}}));
}

TEST(DenseTableTest, StagedChangesAreVisibleOnlyOnceCommittedAndDiscardDropsThem) {
  std::unique_ptr<Table> table = SgdTable(1);
  ASSERT_TRUE(table->Initialize(InitOf({1, 2}, {3})).ok());
  const PushRequest push = PushOf(0, {2, 4}, {-2});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());

  ASSERT_TRUE(table->Stage(push, plan, {}).ok());
  EXPECT_EQ(ValuesOf(*table), (std::vector<std::vector<float>>{{1, 2}, {3}}));
  table->Discard();
  EXPECT_EQ(ValuesOf(*table), (std::vector<std::vector<float>>{{1, 2}, {3}}));

  ASSERT_TRUE(table->Stage(push, plan, UpdateSettings(0.5f, nullptr)).ok());  // the learning rate halved
  table->Commit();
  EXPECT_EQ(ValuesOf(*table), (std::vector<std::vector<float>>{{0.5f, 1}, {3.5f}}));
}

TEST(DenseTableTest, AnUpdateThatWouldOverflowIsRefusedWhole) {
  std::unique_ptr<Table> table = SgdTable(1);
  const float big = std::numeric_limits<float>::max();
  ASSERT_TRUE(table->Initialize(InitOf({1, 2}, {-big})).ok());
  const PushRequest push = PushOf(0, {1, 1}, {big});  // b - 0.5 * big overflows
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
  const absl::Status status = table->Stage(push, plan, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("\"b\""), absl::string_view::npos) << status.message();
  table->Discard();
  EXPECT_EQ(ValuesOf(*table), (std::vector<std::vector<float>>{{1, 2}, {-big}}));
}

TEST(DenseTableTest, TheStepAppliesTheRankOrderedMeanWhateverTheArrivalOrder) {
  const std::vector<std::vector<float>> a = {{0.1f, 0.7f}, {0.3f, -0.2f}, {0.9f, 0.4f}};
  const std::vector<std::vector<float>> b = {{1e-3f}, {2e3f}, {-7.0f}};
  std::vector<float> expected_a = {1, 2}, expected_b = {3};
  for (size_t i = 0; i < 2; ++i) {
    expected_a[i] -= kLearningRate * ((((0.0f + a[0][i]) + a[1][i]) + a[2][i]) * (1.0f / 3));
  }
  expected_b[0] -= kLearningRate * ((((0.0f + b[0][0]) + b[1][0]) + b[2][0]) * (1.0f / 3));

  for (const std::vector<int>& arrival : std::vector<std::vector<int>>{{0, 1, 2}, {2, 1, 0}}) {
    std::unique_ptr<Table> table = SgdTable(3);
    ASSERT_TRUE(table->Initialize(InitOf({1, 2}, {3})).ok());
    for (int rank : arrival) {
      const PushRequest push = PushOf(rank, a[rank], b[rank]);
      TablePush plan;
      ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
      table->Land(rank, push, plan);
    }
    ASSERT_TRUE(table->StageStep({}).ok());
    table->Commit();
    EXPECT_EQ(ValuesOf(*table), (std::vector<std::vector<float>>{expected_a, expected_b}));
  }
}

TEST(DenseTableTest, ACheckpointRestoresIntoAFreshTableAndAnotherOptimizersIsRefused) {
  std::unique_ptr<Table> table = SgdTable(1);
  ASSERT_TRUE(table->Initialize(InitOf({1, 2}, {3})).ok());
  const PushRequest push = PushOf(0, {2, 4}, {-2});
  TablePush plan;
  ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
  ASSERT_TRUE(table->Stage(push, plan, {}).ok());
  table->Commit();
  ShardCheckpoint checkpoint;
  table->Export(&checkpoint);

  std::unique_ptr<Table> restored = SgdTable(1);
  ASSERT_TRUE(restored->Restore(checkpoint).ok());
  EXPECT_TRUE(restored->initialized());
  EXPECT_EQ(ValuesOf(*restored), ValuesOf(*table));

  OptimizerConfig adam;
  adam.mutable_adam()->set_learning_rate(0.1f);
  DenseTable other(std::move(*MakeOptimizer(adam)), 1);
  EXPECT_EQ(other.Restore(checkpoint).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(other.initialized());
}

// A primary's and a backup's tables for the replica tests: Adam (two
// slots a value), `a` large enough to be split over threads.
constexpr size_t kLargeVariable = (size_t{1} << 16) + 4099;

std::unique_ptr<DenseTable> AdamTable(int workers) {
  OptimizerConfig config;
  config.mutable_adam()->set_learning_rate(0.01f);
  return std::make_unique<DenseTable>(std::move(*MakeOptimizer(config)), workers);
}

std::vector<float> Ramp(size_t n, float from, float step) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = from + step * static_cast<float>(i % 977);
  return values;
}

// A SYNC step of two workers on `table`, with `settings`.
void SyncStep(DenseTable* table, int step, const UpdateSettings& settings) {
  for (int rank : {1, 0}) {
    const float at = 0.01f * static_cast<float>(step + 1) * (rank == 0 ? 1.0f : -0.3f);
    const PushRequest push = PushOf(rank, Ramp(kLargeVariable, at, 1e-4f), Ramp(3, -at, 0.5f));
    TablePush plan;
    ASSERT_TRUE(table->CheckPush(push, true, true, &plan).ok());
    table->Land(rank, push, plan);
  }
  ASSERT_TRUE(table->StageStep(settings).ok());
  table->Commit();
}

std::string ExportOf(const Table& table) {
  ShardCheckpoint checkpoint;
  table.Export(&checkpoint);
  return checkpoint.SerializeAsString();
}

TEST(DenseTableTest, ABackupThatAppliesThePrimarysStepsHoldsBitwiseItsValuesAndState) {
  std::unique_ptr<DenseTable> primary = AdamTable(2), backup = AdamTable(2);
  const InitRequest init = InitOf(Ramp(kLargeVariable, 0.5f, -1e-3f), {1, 2, 3});
  ASSERT_TRUE(primary->Initialize(init).ok());
  ASSERT_TRUE(backup->Initialize(init).ok());
  primary->RecordSteps(true);
  UpdateRates rates;
  (*rates.mutable_learning_rates())["b"] = 0.25f;
  for (int step = 0; step < 5; ++step) {
    UpdateSettings settings(step % 2 == 0 ? 1.0f : 0.5f, step == 3 ? &rates : nullptr);
    settings.gradient_scale = step == 2 ? 0.3f : 1.0f;  // clipped
    SyncStep(primary.get(), step, settings);
    DenseSteps steps;
    ASSERT_TRUE(primary->TakeSteps(&steps));
    ASSERT_EQ(steps.steps_size(), 2);
    EXPECT_EQ(steps.steps(0).gradient().size(), kLargeVariable * sizeof(float));
    ASSERT_TRUE(backup->CheckSteps(steps).ok()) << step;
    ASSERT_TRUE(backup->ApplySteps(steps).ok()) << step;
    // Values and both of Adam's slots, bit for bit.
    ASSERT_EQ(ExportOf(*backup), ExportOf(*primary)) << step;
  }
  EXPECT_EQ(backup->store().variable(0).updates, 5);
}

TEST(DenseTableTest, StepsTellAChangeOnlyWhenTheyAreOneWholeUpdate) {
  std::unique_ptr<DenseTable> table = AdamTable(2);
  ASSERT_TRUE(table->Initialize(InitOf(Ramp(kLargeVariable, 0, 1e-3f), {1, 2, 3})).ok());
  DenseSteps steps;
  SyncStep(table.get(), 0, {});
  EXPECT_FALSE(table->TakeSteps(&steps));  // not recording
  table->RecordSteps(true);
  EXPECT_TRUE(table->TakeSteps(&steps));  // no update since: no step
  EXPECT_EQ(steps.steps_size(), 0);
  SyncStep(table.get(), 1, {});
  SyncStep(table.get(), 2, {});
  EXPECT_FALSE(table->TakeSteps(&steps));  // two updates
  EXPECT_EQ(steps.steps_size(), 0);
  SyncStep(table.get(), 3, {});
  EXPECT_TRUE(table->TakeSteps(&steps));
  EXPECT_EQ(steps.steps_size(), 2);
  ShardCheckpoint checkpoint;
  table->Export(&checkpoint);
  ASSERT_TRUE(table->Restore(checkpoint).ok());
  EXPECT_FALSE(table->TakeSteps(&steps));  // replaced whole
}

TEST(DenseTableTest, StepsThatDoNotFitTheVariablesChangeNothing) {
  std::unique_ptr<DenseTable> primary = AdamTable(2), backup = AdamTable(2);
  const InitRequest init = InitOf(Ramp(kLargeVariable, 0.5f, -1e-3f), {1, 2, 3});
  ASSERT_TRUE(primary->Initialize(init).ok());
  ASSERT_TRUE(backup->Initialize(init).ok());
  primary->RecordSteps(true);
  SyncStep(primary.get(), 0, {});
  DenseSteps steps;
  ASSERT_TRUE(primary->TakeSteps(&steps));
  const std::string before = ExportOf(*backup);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::function<void(DenseSteps*)>> breaks = {
      [](DenseSteps* s) { s->mutable_steps(1)->set_name("c"); },
      [](DenseSteps* s) { s->mutable_steps(1)->set_name("a"); },
      [](DenseSteps* s) { s->mutable_steps(1)->mutable_gradient()->resize(8); },
      [](DenseSteps* s) { s->mutable_steps(1)->set_update(2); },
      [](DenseSteps* s) { s->mutable_steps(0)->set_lr_scale(-1.0f); },
      [nan](DenseSteps* s) { s->mutable_steps(1)->set_learning_rate(nan); },
      [nan](DenseSteps* s) {
        std::memcpy(s->mutable_steps(1)->mutable_gradient()->data() + 4, &nan, sizeof(nan));
      },
      [](DenseSteps* s) {  // a gradient too large for Adam's squared gradient
        const float huge = 3e38f;
        std::memcpy(s->mutable_steps(1)->mutable_gradient()->data(), &huge, sizeof(huge));
      },
  };
  // Refused by the check, or (a result that is not finite) by the apply.
  const auto check_and_apply = [&](const DenseSteps& s) {
    const absl::Status checked = backup->CheckSteps(s);
    return checked.ok() ? backup->ApplySteps(s) : checked;
  };
  for (size_t i = 0; i < breaks.size(); ++i) {
    DenseSteps broken = steps;
    breaks[i](&broken);
    EXPECT_EQ(check_and_apply(broken).code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_EQ(ExportOf(*backup), before) << i;
  }
  ASSERT_TRUE(check_and_apply(steps).ok());
  EXPECT_EQ(ExportOf(*backup), ExportOf(*primary));
}

}  // namespace PST_FILE_ID
}  // namespace pst
