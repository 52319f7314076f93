// A SYNC step that needs one gradient (one worker, the others done, or
// backups with replicas_to_aggregate = 1) streams that gradient into the
// update as it arrives, and must be the step the aggregate would have made.
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"

namespace pst {
namespace PST_FILE_ID {

constexpr int64_t kBig = 3 * 4099;  // past one staging block
constexpr int64_t kSmall = 5;
const std::vector<int64_t> kBigShape = {3, 4099};
const std::vector<int64_t> kSmallShape = {kSmall};

ShardOptions SyncAdam(int workers, float lr) {
  ShardOptions options;
  options.mode = SYNC;
  options.num_workers = workers;
  options.optimizer.mutable_adam()->set_learning_rate(lr);
  return options;
}

std::unique_ptr<ParameterShard> MakeInitializedShard(const ShardOptions& options) {
  absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
  EXPECT_TRUE(shard.ok()) << shard.status();
  InitRequest init;
  std::vector<float> big(kBig), small(kSmall);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.001f * static_cast<float>(i % 1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = 0.5f * static_cast<float>(i);
  EncodeTensor("big", kBigShape, big, init.add_variables());
  EncodeTensor("small", kSmallShape, small, init.add_variables());
  InitResponse response;
  EXPECT_TRUE((*shard)->Init(init, &response).ok());
  return std::move(*shard);
}

using Gradients = std::vector<std::vector<float>>;

Gradients GradientsOfRound(int round) {
  Gradients g = {std::vector<float>(kBig), std::vector<float>(kSmall)};
  for (std::vector<float>& tensor : g) {
    for (size_t i = 0; i < tensor.size(); ++i) {
      tensor[i] = std::sin(0.37f * static_cast<float>(i + 11 * round));
    }
  }
  return g;
}

PushRequest PushOf(int worker, int64_t version, const Gradients& g) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  EncodeTensor("big", kBigShape, g[0], push.add_gradients());
  EncodeTensor("small", kSmallShape, g[1], push.add_gradients());
  return push;
}

PushRequest HeaderOf(PushRequest push) {
  for (Tensor& t : *push.mutable_gradients()) t.clear_data();
  return push;
}

// Streams `g` into the update in uneven pieces and commits it.
absl::Status StreamAndCommit(ParameterShard& shard, std::unique_ptr<StreamedUpdate> update,
                             const Gradients& g, PushResponse* response) {
  for (size_t t = 0; t < g.size(); ++t) {
    const std::span<const float> all(g[t]);
    const size_t half = all.size() / 2;
    update->Apply(static_cast<int>(t), 0, all.first(half));
    update->Apply(static_cast<int>(t), static_cast<int64_t>(half), all.subspan(half));
  }
  return shard.CommitStreamedPush(std::move(update), response);
}

std::vector<float> Values(ParameterShard& shard, const std::string& name) {
  PullRequest pull;
  pull.add_names(name);
  PullResponse response;
  EXPECT_TRUE(Pull(shard, pull, absl::Now(), &response).ok());
  std::vector<float> values(response.variables(0).data().size() / sizeof(float));
  DecodeTensor(response.variables(0), values);
  return values;
}

void ExpectSameBits(ParameterShard& a, ParameterShard& b) {
  for (const char* name : {"big", "small"}) {
    const std::vector<float> x = Values(a, name), y = Values(b, name);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << name;
  }
}

TEST(SyncStepOfOneTest, OneWorkersStepStreamsAndEqualsTheAggregatedStepBitForBit) {
  // Adam, two steps: the state and the bias correction must agree too.
  auto aggregated = MakeInitializedShard(SyncAdam(1, 0.01f));
  auto streamed = MakeInitializedShard(SyncAdam(1, 0.01f));
  for (int step = 0; step < 2; ++step) {
    const Gradients g = GradientsOfRound(step);
    PushResponse expected, response;
    ASSERT_TRUE(Push(*aggregated, PushOf(0, step, g), &expected).ok());
    absl::StatusOr<ParameterShard::StreamedPush> push =
        streamed->BeginStreamedPush(HeaderOf(PushOf(0, step, g)));
    ASSERT_TRUE(push.ok()) << push.status();
    ASSERT_NE(push->update, nullptr) << "the step is this one gradient: it streams";
    EXPECT_TRUE(streamed->AnswerMayStreamDuringPush(*push->update, step + 1))
        << "committed, the push is the step's version";
    EXPECT_FALSE(streamed->AnswerMayStreamDuringPush(*push->update, step + 2));
    ASSERT_TRUE(StreamAndCommit(*streamed, std::move(push->update), g, &response).ok());
    EXPECT_EQ(response.outcome(), expected.outcome());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
    EXPECT_EQ(response.version(), step + 1);
  }
  ExpectSameBits(*aggregated, *streamed);
  StatsResponse a, s;
  aggregated->Stats(&a);
  streamed->Stats(&s);
  EXPECT_EQ(s.pushes_applied(), a.pushes_applied());
  EXPECT_EQ(s.workers(0).clock(), a.workers(0).clock());
  // The next step's push is admitted as usual: the worker is not left
  // marked as having pushed.
  PushResponse next;
  EXPECT_TRUE(Push(*streamed, PushOf(0, 2, GradientsOfRound(2)), &next).ok());
  EXPECT_EQ(next.outcome(), PushResponse::APPLIED);
}

TEST(SyncStepOfOneTest, AStepOfOneThatWouldOverflowIsSkippedAsAnAggregatedStepIs) {
  auto aggregated = MakeInitializedShard(SyncAdam(1, 0.1f));
  auto streamed = MakeInitializedShard(SyncAdam(1, 0.1f));
  Gradients g = GradientsOfRound(0);
  g[1][3] = 3e38f;  // finite; Adam's squared gradient is not
  PushResponse expected, response;
  ASSERT_TRUE(Push(*aggregated, PushOf(0, 0, g), &expected).ok());
  ASSERT_EQ(expected.outcome(), PushResponse::SKIPPED);
  absl::StatusOr<ParameterShard::StreamedPush> push =
      streamed->BeginStreamedPush(HeaderOf(PushOf(0, 0, g)));
  ASSERT_TRUE(push.ok() && push->update != nullptr);
  ASSERT_TRUE(StreamAndCommit(*streamed, std::move(push->update), g, &response).ok())
      << "the workers wait for the next version whatever happens";
  EXPECT_EQ(response.outcome(), PushResponse::SKIPPED);
  EXPECT_EQ(response.version(), 1);
  ExpectSameBits(*aggregated, *streamed);
  StatsResponse s;
  streamed->Stats(&s);
  EXPECT_EQ(s.pushes_rejected(), 1);
  EXPECT_EQ(s.version(), 1);
}

TEST(SyncStepOfOneTest, OnlyAStepThatNeedsNoOtherGradientStreams) {
  const Gradients g = GradientsOfRound(0);
  // Two workers: the first push waits for the second.
  auto both = MakeInitializedShard(SyncAdam(2, 0.01f));
  absl::StatusOr<ParameterShard::StreamedPush> push =
      both->BeginStreamedPush(HeaderOf(PushOf(0, 0, g)));
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->update, nullptr) << "SYNC averages the two";
  EXPECT_FALSE(push->awaits_turn);

  // The other worker is done: the step is the one gradient.
  DoneRequest done;
  done.set_worker(1);
  DoneResponse done_response;
  ASSERT_TRUE(both->Done(done, &done_response).ok());
  push = both->BeginStreamedPush(HeaderOf(PushOf(0, 0, g)));
  ASSERT_TRUE(push.ok());
  ASSERT_NE(push->update, nullptr);
  PushResponse response;
  ASSERT_TRUE(StreamAndCommit(*both, std::move(push->update), g, &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::APPLIED);

  // Backups: the first of two workers makes the step, the other's gradient
  // for it is then stale and dropped.
  ShardOptions backups = SyncAdam(2, 0.01f);
  backups.replicas_to_aggregate = 1;
  auto first_wins = MakeInitializedShard(backups);
  push = first_wins->BeginStreamedPush(HeaderOf(PushOf(1, 0, g)));
  ASSERT_TRUE(push.ok());
  ASSERT_NE(push->update, nullptr);
  ASSERT_TRUE(StreamAndCommit(*first_wins, std::move(push->update), g, &response).ok());
  EXPECT_EQ(response.version(), 1);
  ASSERT_TRUE(Push(*first_wins, PushOf(0, 0, g), &response).ok());
  EXPECT_EQ(response.outcome(), PushResponse::DROPPED);

  // A gradient already aggregated into the step: the step is two, the
  // second push is summed with it, not streamed.
  ShardOptions two_of_three = SyncAdam(3, 0.01f);
  two_of_three.replicas_to_aggregate = 2;
  auto aggregating = MakeInitializedShard(two_of_three);
  ASSERT_TRUE(Push(*aggregating, PushOf(0, 0, g), &response).ok());
  ASSERT_EQ(response.outcome(), PushResponse::AGGREGATED);
  push = aggregating->BeginStreamedPush(HeaderOf(PushOf(1, 0, g)));
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->update, nullptr);
}

TEST(SyncStepOfOneTest, AStreamThatLeavesOutAVariableIsRefusedAsAPushIsAndChangesNothing) {
  // A step of one gradient must cover the shard as the aggregate would.
  auto aggregated = MakeInitializedShard(SyncAdam(1, 0.01f));
  auto streamed = MakeInitializedShard(SyncAdam(1, 0.01f));
  PushRequest partial = PushOf(0, 0, GradientsOfRound(0));
  partial.mutable_gradients()->RemoveLast();  // no "small"
  PushResponse expected;
  const absl::Status refused = Push(*aggregated, partial, &expected);
  ASSERT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ParameterShard::StreamedPush> push =
      streamed->BeginStreamedPush(HeaderOf(partial));
  ASSERT_FALSE(push.ok()) << "the header already shows the missing variable";
  EXPECT_EQ(push.status().code(), refused.code());
  EXPECT_EQ(push.status().message(), refused.message());
  ExpectSameBits(*aggregated, *streamed);
  StatsResponse s;
  streamed->Stats(&s);
  EXPECT_EQ(s.version(), 0);
  EXPECT_EQ(s.pushes_rejected(), 1);
}

}  // namespace PST_FILE_ID
}  // namespace pst
