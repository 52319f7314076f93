// StepAggregate: the SYNC step's mean is bitwise 0 + g_0 + g_1 + ... in rank
// order times 1/N, whatever order the ranks land in, whichever ranks stay
// away, and however many land at once.
#include "ps_server/core/step_aggregate.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"
#include "gtest/gtest.h"
#include "ps_server/core/sync_reduce.h"

namespace pst {
namespace PST_FILE_ID {

// Two variables: one small, one split over reduce threads with a ragged end.
const std::vector<size_t> kSizes = {37, 2 * kParallelElements + 5};

std::vector<float> Random(size_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = value(*rng);
  return v;
}

std::unique_ptr<VariableStore> SgdStore(const std::vector<std::vector<float>>& initial) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(0.5f);
  auto store = std::make_unique<VariableStore>(std::move(*MakeOptimizer(config)));
  google::protobuf::RepeatedPtrField<Tensor> tensors;
  for (size_t v = 0; v < initial.size(); ++v) {
    EncodeTensor(absl::StrCat("v", v),
                 std::vector<int64_t>{static_cast<int64_t>(initial[v].size())}, initial[v],
                 tensors.Add());
  }
  EXPECT_TRUE(store->Initialize(tensors).ok());
  return store;
}

struct Job {
  std::vector<std::vector<float>> initial;             // per variable
  std::vector<std::vector<std::vector<float>>> ranks;  // per rank, per variable
  std::vector<PushRequest> pushes;                     // per rank

  Job(int workers, uint32_t seed, DType dtype) {
    std::mt19937 rng(seed);
    for (size_t n : kSizes) initial.push_back(Random(n, &rng));
    for (int r = 0; r < workers; ++r) {
      ranks.emplace_back();
      pushes.emplace_back();
      pushes.back().set_worker(r);
      for (size_t v = 0; v < kSizes.size(); ++v) {
        std::vector<float> g = Random(kSizes[v], &rng);
        g[0] = -0.0f;  // 0 + -0 is +0: the sum must start from 0, not from g_0
        EncodeTensor(absl::StrCat("v", v), std::vector<int64_t>{static_cast<int64_t>(g.size())}, g,
                     pushes.back().add_gradients(), dtype);
        DecodeTensor(pushes.back().gradients(static_cast<int>(v)), g);  // what the wire carries
        ranks.back().push_back(std::move(g));
      }
    }
  }

  // The definition, element by element: 0 + g_r over `members` in rank
  // order, times 1/|members|, then SGD.
  std::vector<std::vector<float>> Expected(const std::vector<int>& members) const {
    std::vector<std::vector<float>> values = initial;
    for (size_t v = 0; v < kSizes.size(); ++v) {
      for (size_t i = 0; i < kSizes[v]; ++i) {
        float sum = 0.0f;
        for (int r : members) sum += ranks[r][v][i];
        sum *= 1.0f / static_cast<float>(members.size());
        values[v][i] -= 0.5f * sum;
      }
    }
    return values;
  }

  std::vector<std::vector<float>> Run(StepAggregate* step, const std::vector<int>& arrival,
                                      ThreadPool* threads, int parts) const {
    auto store = SgdStore(initial);
    const std::vector<int> indices = {0, 1};
    for (int r : arrival) step->Land(r, pushes[r], indices);
    EXPECT_EQ(step->landed(), static_cast<int>(arrival.size()));
    EXPECT_TRUE(step->Stage(store.get(), {}, threads, parts).ok());
    store->Commit();
    std::vector<std::vector<float>> values;
    for (size_t v = 0; v < kSizes.size(); ++v) values.push_back(*store->variable(v).values);
    return values;
  }
};

TEST(StepAggregateTest, EveryArrivalOrderGivesTheRankOrderSumBitwise) {
  const Job job(4, 7, FLOAT32);
  const std::vector<std::vector<float>> expected = job.Expected({0, 1, 2, 3});
  StepAggregate step(4);
  step.Reset(kSizes);
  ThreadPool threads;
  std::vector<int> arrival = {0, 1, 2, 3};
  do {
    SCOPED_TRACE(absl::StrCat("arrival ", arrival[0], arrival[1], arrival[2], arrival[3]));
    // The same aggregate, step after step: each Stage empties it.
    ASSERT_EQ(job.Run(&step, arrival, &threads, 3), expected);
  } while (std::next_permutation(arrival.begin(), arrival.end()));
}

TEST(StepAggregateTest, RanksThatStayAwayAreSkippedInOrder) {
  // Backup workers and ranks out of the live set: the step completes
  // without them, and whatever waited behind them is still added in order.
  const Job job(4, 8, FLOAT32);
  StepAggregate step(4);
  step.Reset(kSizes);
  ThreadPool threads;
  for (const std::vector<int>& arrival : std::vector<std::vector<int>>{
           {3, 1}, {1, 3}, {2, 3, 1}, {0, 2}, {2, 0}, {3}, {0}, {1, 0, 3}}) {
    std::vector<int> members = arrival;
    std::sort(members.begin(), members.end());
    SCOPED_TRACE(absl::StrCat("arrival of ", arrival.size(), " starting with ", arrival[0]));
    ASSERT_EQ(job.Run(&step, arrival, &threads, 2), job.Expected(members));
  }
}

TEST(StepAggregateTest, SixteenBitPayloadsAreDecodedAsTheyAreAdded) {
  for (DType dtype : {BFLOAT16, FLOAT16}) {
    const Job job(3, 9, dtype);
    StepAggregate step(3);
    step.Reset(kSizes);
    ThreadPool threads;
    EXPECT_EQ(job.Run(&step, {2, 0, 1}, &threads, 1), job.Expected({0, 1, 2}));
    EXPECT_EQ(job.Run(&step, {0, 1, 2}, &threads, 1), job.Expected({0, 1, 2}));
  }
}

TEST(StepAggregateTest, RanksLandingAtOnceGiveTheRankOrderSumBitwise) {
  constexpr int kWorkers = 6;
  const Job job(kWorkers, 10, FLOAT32);
  std::vector<int> all(kWorkers);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<std::vector<float>> expected = job.Expected(all);
  StepAggregate step(kWorkers);
  step.Reset(kSizes);
  ThreadPool reduce;
  const std::vector<int> indices = {0, 1};
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    {
      std::vector<std::jthread> landers;
      for (int r = 0; r < kWorkers; ++r) {
        landers.emplace_back([&, r] { step.Land(r, job.pushes[r], indices); });
      }
    }
    auto store = SgdStore(job.initial);
    ASSERT_TRUE(step.Stage(store.get(), {}, &reduce, 2).ok());
    store->Commit();
    for (size_t v = 0; v < kSizes.size(); ++v) ASSERT_EQ(*store->variable(v).values, expected[v]);
  }
}

TEST(StepAggregateTest, NonFiniteMeanIsRefusedAndTheNextStepStartsEmpty) {
  Job job(2, 11, FLOAT32);
  std::vector<float> huge(kSizes[0], 3e38f);
  EncodeTensor("v0", std::vector<int64_t>{static_cast<int64_t>(kSizes[0])}, huge,
               job.pushes[0].mutable_gradients(0));
  EncodeTensor("v0", std::vector<int64_t>{static_cast<int64_t>(kSizes[0])}, huge,
               job.pushes[1].mutable_gradients(0));
  StepAggregate step(2);
  step.Reset(kSizes);
  ThreadPool threads;
  auto store = SgdStore(job.initial);
  const std::vector<int> indices = {0, 1};
  step.Land(1, job.pushes[1], indices);
  step.Land(0, job.pushes[0], indices);
  EXPECT_EQ(step.Stage(store.get(), {}, &threads, 1).code(), absl::StatusCode::kInvalidArgument);
  store->Discard();
  EXPECT_EQ(step.landed(), 0);
  EXPECT_EQ(step.Stage(store.get(), {}, &threads, 1).code(), absl::StatusCode::kInternal);
}

}  // namespace PST_FILE_ID
}  // namespace pst
