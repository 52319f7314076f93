// Updates applied while their gradient streams in (StreamedUpdate).
#include "ps_server/core/parameter_shard.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/ps_server/core/parameter_shard_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace shard_testing;  // NOLINT(build/namespaces)

// Two variables of sizes that are no multiple of any block: "big" [3, 4099]
// and "small" [5], filled with 0.001 * i.
InitRequest StreamingModel() {
  InitRequest init;
  std::vector<float> big(3 * 4099), small(5);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 0.001f * static_cast<float>(i % 1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = 0.5f * static_cast<float>(i);
  AddTensor("big", {3, 4099}, big, init.mutable_variables());
  AddTensor("small", {5}, small, init.mutable_variables());
  return init;
}

std::vector<std::vector<float>> StreamingGradients(int round) {
  std::vector<std::vector<float>> g = {std::vector<float>(3 * 4099), std::vector<float>(5)};
  for (auto& tensor : g) {
    for (size_t i = 0; i < tensor.size(); ++i) {
      tensor[i] = std::sin(0.37f * static_cast<float>(i + 11 * round));
    }
  }
  return g;
}

PushRequest StreamingPush(int worker, int64_t version, const std::vector<std::vector<float>>& g) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  AddTensor("big", {3, 4099}, g[0], push.mutable_gradients());
  AddTensor("small", {5}, g[1], push.mutable_gradients());
  return push;
}

// A push's header as a stream announces it: names, shapes, dtypes, no data.
PushRequest HeaderOf(PushRequest push) {
  for (Tensor& t : *push.mutable_gradients()) t.clear_data();
  return push;
}

// Applies `g` to `update` in uneven pieces, as a stream would deliver them.
void ApplyInPieces(StreamedUpdate* update, const std::vector<std::vector<float>>& g) {
  for (size_t t = 0; t < g.size(); ++t) {
    const std::span<const float> all(g[t]);
    size_t first = 0;
    for (size_t piece : {size_t{1}, size_t{4095}, size_t{3000}, size_t{2049}}) {
      piece = std::min(piece, all.size() - first);
      update->Apply(static_cast<int>(t), static_cast<int64_t>(first), all.subspan(first, piece));
      first += piece;
    }
    update->Apply(static_cast<int>(t), static_cast<int64_t>(first), all.subspan(first));
  }
}

TEST(StreamedUpdateTest, PieceByPieceEqualsOnePushBitForBit) {
  // Adam: state slots and bias correction must come out the same too,
  // hence two rounds.
  ShardOptions options = Options(ASYNC, 1);
  options.optimizer.mutable_adam()->set_learning_rate(0.01f);
  auto whole = MakeShard(options);
  auto streamed = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(whole->Init(StreamingModel(), &init).ok());
  ASSERT_TRUE(streamed->Init(StreamingModel(), &init).ok());
  for (int round = 0; round < 2; ++round) {
    const std::vector<std::vector<float>> g = StreamingGradients(round);
    PushResponse expected, response;
    ASSERT_TRUE(Push(*whole, StreamingPush(0, round, g), &expected).ok());
    auto push = streamed->BeginStreamedPush(HeaderOf(StreamingPush(0, round, g)));
    ASSERT_TRUE(push.ok()) << push.status();
    EXPECT_THAT(push->bytes, ::testing::ElementsAre(3 * 4099 * 4, 5 * 4));
    ASSERT_NE(push->update, nullptr) << "an idle ASYNC shard applies a stream as it comes";
    ApplyInPieces(push->update.get(), g);
    ASSERT_TRUE(streamed->CommitStreamedPush(std::move(push->update), &response).ok());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
    EXPECT_EQ(response.version(), expected.version());
  }
  for (const char* name : {"big", "small"}) {
    const std::vector<float> a = PullValues(whole.get(), name);
    const std::vector<float> b = PullValues(streamed.get(), name);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name;
  }
  EXPECT_EQ(StatsOf(streamed.get()).pushes_applied(), 2);
  EXPECT_EQ(StatsOf(streamed.get()).workers(0).clock(), 2);
}

// A gradient at hand whole (a shared region's) is staged in parts at once
// on the shard's threads, each on its own copy of the target.
TEST(StreamedUpdateTest, AWholeGradientStagedInPartsEqualsOnePushBitForBit) {
  constexpr int64_t kRows = 5, kColumns = 40001;  // above the parallel threshold
  constexpr int64_t kBlock = 4096;
  ShardOptions options = Options(ASYNC, 1);
  options.optimizer.mutable_adam()->set_learning_rate(0.01f);
  auto whole = MakeShard(options);
  auto parts = MakeShard(options);
  InitRequest init;
  std::vector<float> initial(kRows * kColumns);
  for (size_t i = 0; i < initial.size(); ++i) initial[i] = 0.001f * static_cast<float>(i % 997);
  AddTensor("big", {kRows, kColumns}, initial, init.mutable_variables());
  InitResponse init_response;
  ASSERT_TRUE(whole->Init(init, &init_response).ok());
  ASSERT_TRUE(parts->Init(init, &init_response).ok());
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  for (int round = 0; round < 2; ++round) {  // Adam's state must match too
    std::vector<float> g(kRows * kColumns);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * static_cast<float>(i + round));
    PushRequest push;
    push.set_worker(0);
    push.set_computed_at_version(round);
    AddTensor("big", {kRows, kColumns}, g, push.mutable_gradients());
    PushResponse expected, response;
    ASSERT_TRUE(Push(*whole, push, &expected).ok());
    auto begun = parts->BeginStreamedPush(HeaderOf(push));
    ASSERT_TRUE(begun.ok() && begun->update != nullptr);
    std::vector<int64_t> staged;  // first element of each block
    ASSERT_TRUE(begun->update
                    ->ApplyWhole(0, kRows * kColumns, kBlock,
                                 [&](VariableStore::StageTarget* target, int64_t first,
                                     int64_t count) {
                                   {
                                     absl::MutexLock lock(&mu);
                                     threads.insert(std::this_thread::get_id());
                                     staged.push_back(first);
                                   }
                                   EXPECT_LE(count, kBlock);
                                   target->Apply(first, std::span<const float>(g).subspan(
                                                            first, count));
                                   return absl::OkStatus();
                                 })
                    .ok());
    std::sort(staged.begin(), staged.end());
    ASSERT_EQ(staged.size(), static_cast<size_t>((kRows * kColumns + kBlock - 1) / kBlock));
    for (size_t b = 0; b < staged.size(); ++b) EXPECT_EQ(staged[b], b * kBlock);
    ASSERT_TRUE(parts->CommitStreamedPush(std::move(begun->update), &response).ok());
    EXPECT_EQ(response.version(), expected.version());
  }
  const std::vector<float> a = PullValues(whole.get(), "big");
  const std::vector<float> b = PullValues(parts.get(), "big");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  if (std::thread::hardware_concurrency() > 1) {
    EXPECT_GT(threads.size(), 1u);
  }
}

TEST(StreamedUpdateTest, APartThatFailsFailsTheWholeAndNothingLands) {
  constexpr int64_t kElements = 200000;
  auto shard = MakeShard(ASYNC, 1);
  InitRequest init;
  AddTensor("big", {kElements}, std::vector<float>(kElements, 1.0f), init.mutable_variables());
  InitResponse init_response;
  ASSERT_TRUE(shard->Init(init, &init_response).ok());
  PushRequest header;
  header.set_worker(0);
  Tensor* gradient = header.add_gradients();
  gradient->set_name("big");
  gradient->add_shape(kElements);
  gradient->set_dtype(FLOAT32);
  const std::vector<float> g(kElements, 0.5f);
  {
    auto begun = shard->BeginStreamedPush(header);
    ASSERT_TRUE(begun.ok() && begun->update != nullptr);
    absl::Status status = begun->update->ApplyWhole(
        0, kElements, 1024, [&](VariableStore::StageTarget* target, int64_t first, int64_t count) {
          if (first == 150 * 1024) return absl::InvalidArgumentError("block 150 is bad");
          target->Apply(first, std::span<const float>(g).subspan(first, count));
          return absl::OkStatus();
        });
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), ::testing::HasSubstr("block 150"));
  }  // dropped
  EXPECT_THAT(PullValues(shard.get(), "big"), ::testing::Each(1.0f));
  EXPECT_EQ(StatsOf(shard.get()).pushes_applied(), 0);
}

// A push that can wait where it lies (a shared region) is told it only
// awaits its turn; its waiter for the turn is woken when the update
// staging before it is committed, and it then gets an update of its own.
TEST(StreamedUpdateTest, APushThatMayWaitIsStagedAfterTheUpdateBeforeIt) {
  auto shard = MakeShard(ASYNC, 2);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto first = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(first.ok() && first->update != nullptr);
  auto busy = shard->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(busy->update, nullptr);
  EXPECT_TRUE(busy->awaits_turn);

  absl::Notification turn;
  ASSERT_NE(shard->AwaitUpdateTurnOrWait([&turn] { turn.Notify(); }), 0u);
  EXPECT_EQ(shard->waiting_updates(), 1);
  ApplyInPieces(first->update.get(), g);
  EXPECT_FALSE(turn.HasBeenNotified()) << "woken while another update was staging";
  PushResponse response;
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(first->update), &response).ok());
  EXPECT_TRUE(turn.HasBeenNotified()) << "the commit did not wake the waiter for the turn";
  EXPECT_EQ(shard->waiting_updates(), 0);
  auto second = shard->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_NE(second->update, nullptr);
  ApplyInPieces(second->update.get(), g);
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(second->update), &response).ok());
  EXPECT_EQ(response.version(), 2);

  // SYNC never streams: nothing to wait for.
  auto sync = MakeShard(SYNC, 2);
  ASSERT_TRUE(sync->Init(StreamingModel(), &init).ok());
  auto summed = sync->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(summed.ok());
  EXPECT_EQ(summed->update, nullptr);
  EXPECT_FALSE(summed->awaits_turn);
}

TEST(StreamedUpdateTest, OtherUpdatesWaitAndPullsSeeTheOldValuesUntilItCommits) {
  auto shard = MakeShard(ASYNC, 2);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> before = PullValues(shard.get(), "small");
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto first = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(first.ok() && first->update != nullptr);
  EXPECT_TRUE(shard->streamed_update_staged());
  // A second stream meanwhile is reassembled instead, and pushed whole.
  auto second = shard->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->update, nullptr);
  ApplyInPieces(first->update.get(), g);
  EXPECT_EQ(PullValues(shard.get(), "small"), before) << "staged, not yet visible";

  std::atomic<bool> pushed{false};
  PushResponse later;
  std::thread pusher([&] {
    EXPECT_TRUE(Push(*shard, StreamingPush(1, 0, g), &later).ok());
    pushed = true;
  });
  EXPECT_TRUE(Eventually([&] { return shard->waiting_updates() == 1 || pushed.load(); }));
  EXPECT_FALSE(pushed.load()) << "a push went through while a streamed update was staged";
  EXPECT_EQ(shard->waiting_updates(), 1);
  PushResponse response;
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(first->update), &response).ok());
  pusher.join();
  EXPECT_EQ(shard->waiting_updates(), 0);
  EXPECT_FALSE(shard->streamed_update_staged());
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(later.version(), 2) << "applied after the streamed update, on top of it";
  const std::vector<float> after = PullValues(shard.get(), "small");
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_FLOAT_EQ(after[i], before[i] - 2 * g[1][i]) << i;
  }
}

TEST(StreamedUpdateTest, AnAbandonedUpdateLeavesNoTraceAndFreesTheStaging) {
  auto shard = MakeShard(ASYNC, 1);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> before = PullValues(shard.get(), "big");
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  {
    auto push = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
    ASSERT_TRUE(push.ok() && push->update != nullptr);
    push->update->Apply(0, 0, std::span<const float>(g[0]).first(5000));
  }  // the stream broke off
  EXPECT_EQ(PullValues(shard.get(), "big"), before);
  EXPECT_EQ(StatsOf(shard.get()).version(), 0);
  EXPECT_EQ(StatsOf(shard.get()).workers(0).clock(), 0);
  PushResponse response;
  ASSERT_TRUE(Push(*shard, StreamingPush(0, 0, g), &response).ok()) << "the staging is free";
  EXPECT_EQ(response.version(), 1);
}

TEST(StreamedUpdateTest, AnUpdateThatWouldOverflowIsRefusedWholeAtCommit) {
  ShardOptions options = Options(ASYNC, 1);
  options.optimizer.mutable_adam()->set_learning_rate(0.1f);
  auto shard = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> big = PullValues(shard.get(), "big");
  std::vector<std::vector<float>> g = StreamingGradients(0);
  g[1][3] = 3e38f;  // finite; Adam's squared gradient is not
  auto push = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(push.ok() && push->update != nullptr);
  ApplyInPieces(push->update.get(), g);
  PushResponse response;
  absl::Status status = shard->CommitStreamedPush(std::move(push->update), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"small\""));
  EXPECT_EQ(PullValues(shard.get(), "big"), big) << "the variable that updated fine kept its values too";
  EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
  EXPECT_EQ(StatsOf(shard.get()).version(), 0);
  ASSERT_TRUE(Push(*shard, StreamingPush(0, 0, StreamingGradients(1)), &response).ok());
}

TEST(StreamedUpdateTest, OnlyAnAsyncPushThatWillBeAppliedStreamsItsUpdate) {
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  InitResponse init;
  auto sync = MakeShard(SYNC, 2);
  ASSERT_TRUE(sync->Init(StreamingModel(), &init).ok());
  auto push = sync->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->update, nullptr) << "SYNC averages first";
  EXPECT_THAT(push->bytes, ::testing::ElementsAre(3 * 4099 * 4, 5 * 4));

  ShardOptions options = Options(ASYNC, 2);
  options.max_staleness = 1;
  auto bounded = MakeShard(options);
  ASSERT_TRUE(bounded->Init(StreamingModel(), &init).ok());
  PushResponse response;
  ASSERT_TRUE(Push(*bounded, StreamingPush(0, 0, g), &response).ok());
  ASSERT_TRUE(Push(*bounded, StreamingPush(0, 1, g), &response).ok());
  push = bounded->BeginStreamedPush(HeaderOf(StreamingPush(1, 0, g)));  // staleness 2
  ASSERT_TRUE(push.ok());
  EXPECT_EQ(push->update, nullptr) << "a gradient to be dropped is not applied";

  // A header the shard refuses is refused before any payload, and counted.
  PushRequest bad = HeaderOf(StreamingPush(0, 2, g));
  bad.mutable_gradients(1)->mutable_shape()->Set(0, 6);
  push = bounded->BeginStreamedPush(bad);
  EXPECT_EQ(push.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(push.status().message(), HasSubstr("wrong shape"));
  bad = HeaderOf(StreamingPush(0, 7, g));
  // Not registered, the worker may have computed across a restart.
  EXPECT_EQ(bounded->BeginStreamedPush(bad).status().code(), absl::StatusCode::kUnavailable)
      << "a gradient from the future, from a worker not registered here";
  RegisterWorker(bounded.get(), 0);
  EXPECT_EQ(bounded->BeginStreamedPush(bad).status().code(), absl::StatusCode::kInvalidArgument)
      << "a gradient from the future";
  EXPECT_EQ(StatsOf(bounded.get()).pushes_rejected(), 3);
}


TEST(StreamedUpdateTest, AStalledStreamIsCancelledWhenAnotherUpdateWaits) {
  ShardOptions options = Options(ASYNC, 2);
  options.stalled_stream_timeout = absl::Milliseconds(300);
  auto shard = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<float> before = PullValues(shard.get(), "small");
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto stalled = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(stalled.ok() && stalled->update != nullptr);
  std::atomic<int> cancels{0};
  absl::Notification cancelled;
  stalled->update->SetCancel([&] {
    if (++cancels == 1) cancelled.Notify();
  });
  stalled->update->Apply(0, 0, std::span<const float>(g[0]).first(100));  // then nothing

  const absl::Time start = absl::Now();
  PushResponse pushed;
  std::thread pusher([&] { EXPECT_TRUE(Push(*shard, StreamingPush(1, 0, g), &pushed).ok()); });
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(cancels.load(), 1);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250)) << "cancelled before it stalled";
  // The stream's reads now fail: whatever it does next, nothing of it lands.
  ApplyInPieces(stalled->update.get(), g);
  PushResponse response;
  absl::Status status = shard->CommitStreamedPush(std::move(stalled->update), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  pusher.join();
  EXPECT_EQ(pushed.version(), 1);
  const std::vector<float> after = PullValues(shard.get(), "small");
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - g[1][i]) << i;
  EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
  EXPECT_EQ(cancels.load(), 1);
}

TEST(StreamedUpdateTest, AStreamThatKeepsDeliveringIsNotCancelled) {
  ShardOptions options = Options(ASYNC, 2);
  options.stalled_stream_timeout = absl::Milliseconds(600);
  auto shard = MakeShard(options);
  InitResponse init;
  ASSERT_TRUE(shard->Init(StreamingModel(), &init).ok());
  const std::vector<std::vector<float>> g = StreamingGradients(0);
  auto slow = shard->BeginStreamedPush(HeaderOf(StreamingPush(0, 0, g)));
  ASSERT_TRUE(slow.ok() && slow->update != nullptr);
  std::atomic<int> cancels{0};
  slow->update->SetCancel([&] { ++cancels; });
  PushResponse pushed;
  std::atomic<bool> push_returned{false};
  std::thread pusher([&] {
    EXPECT_TRUE(Push(*shard, StreamingPush(1, 0, g), &pushed).ok());
    push_returned = true;
  });
  // The stall timeout only runs while another update waits: the stream
  // starts delivering once the push waits, and keeps up its progress until
  // then as a live stream would.
  EXPECT_TRUE(Eventually([&] {
    slow->update->Progressed();
    return shard->waiting_updates() == 1;
  })) << "the push never waited";
  // Three times the timeout in all, never more than a third of it silent:
  // the pauses are the slow stream under test.
  const std::span<const float> big(g[0]);
  const size_t step = big.size() / 18 + 1;
  for (size_t first = 0; first < big.size(); first += step) {
    absl::SleepFor(absl::Milliseconds(100));
    slow->update->Progressed();
    slow->update->Apply(0, static_cast<int64_t>(first),
                        big.subspan(first, std::min(step, big.size() - first)));
  }
  slow->update->Apply(1, 0, g[1]);
  // Not waiting_updates(): a waiting push leaves the count for a moment each
  // time its recheck deadline wakes it.
  EXPECT_FALSE(push_returned.load()) << "the push went ahead before the stream ended";
  EXPECT_EQ(cancels.load(), 0) << "a delivering stream was cancelled";
  PushResponse response;
  ASSERT_TRUE(shard->CommitStreamedPush(std::move(slow->update), &response).ok());
  pusher.join();
  EXPECT_EQ(cancels.load(), 0);
  EXPECT_EQ(response.version(), 1);
  EXPECT_EQ(pushed.version(), 2);
}

}  // namespace PST_FILE_ID
}  // namespace pst
