// What one PS shard refuses (bad pushes, pulls and inits), and that a refusal
// leaves the model as it was.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/tensor_codec.h"
#include "common/transient_refusal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/ps_server/core/parameter_shard_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace shard_testing;  // NOLINT(build/namespaces)

// Every bad request is refused with the right code and leaves the model as
// it was.
TEST(ParameterShardTest, BadPushesAreRefusedAndLeaveTheModelUntouched) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string name;
    std::function<PushRequest()> make;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases = {
      {"unknown variable",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(1)->set_name("nope");
         return p;
       },
       absl::StatusCode::kInvalidArgument, "unknown variable \"nope\""},
      {"wrong payload size",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(0)->set_data(std::string(12, '\0'));
         return p;
       },
       absl::StatusCode::kInvalidArgument, "carries 12 bytes"},
      {"wrong shape",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(0)->clear_shape();
         p.mutable_gradients(0)->add_shape(4);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "wrong shape"},
      {"NaN gradient", [&] { return Gradient(0, 0, {1, nan, 1, 1}, {1, 1}); },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {"Inf gradient in the last variable", [&] { return Gradient(0, 0, {1, 1, 1, 1}, {1, inf}); },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      // 16-bit gradients are checked on their encoded bits.
      {"NaN bfloat16 gradient",
       [&] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         EncodeTensor("w", std::vector<int64_t>{2, 2}, std::vector<float>{1, 1, nan, 1},
                      p.mutable_gradients(0), BFLOAT16);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {"Inf float16 gradient (overflow past 65504)",
       [&] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{1, 1e6f},
                      p.mutable_gradients(1), FLOAT16);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "non-finite"},
      {"future version", [] { return Gradient(0, 7, {1, 1, 1, 1}, {1, 1}); },
       absl::StatusCode::kInvalidArgument, "version 7"},
      {"worker out of range", [] { return Gradient(5, 0, {1, 1, 1, 1}, {1, 1}); },
       absl::StatusCode::kInvalidArgument, "worker index 5"},
      {"missing variable in SYNC",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients()->RemoveLast();
         return p;
       },
       absl::StatusCode::kInvalidArgument, "missing the gradient for \"b\""},
      {"same variable twice",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         *p.mutable_gradients(1) = p.gradients(0);
         return p;
       },
       absl::StatusCode::kInvalidArgument, "appears twice"},
      {"unsupported dtype",
       [] {
         PushRequest p = Gradient(0, 0, {1, 1, 1, 1}, {1, 1});
         p.mutable_gradients(0)->set_dtype(static_cast<DType>(7));
         return p;
       },
       absl::StatusCode::kInvalidArgument, "dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto shard = MakeShard(SYNC, 2);
    InitTwoVariables(shard.get());
    // Registered: a version from the future is then bad input, not a
    // restart the worker has not seen.
    RegisterWorker(shard.get(), 0);
    PushResponse response;
    absl::Status status = Push(*shard, c.make(), &response);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    // A good push from each worker must now complete the step normally: the
    // bad one neither applied nor counted as worker 0's gradient.
    ASSERT_TRUE(Push(*shard, Gradient(0, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
    ASSERT_TRUE(Push(*shard, Gradient(1, 0, {0, 0, 0, 0}, {0, 0}), &response).ok());
    EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
    EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));
    EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
  }
}

// A finite gradient can still overflow the optimizer (Adam squares it). The
// update is refused as a whole: no variable, no optimizer state, no version
// moves, in ASYNC; in SYNC the step completes (the workers wait for it) but
// leaves the model as it was. Then training goes on normally.
TEST(ParameterShardTest, AnUpdateThatWouldOverflowIsRefusedWhole) {
  constexpr float kHuge = 3e38f;  // finite; its square is not
  for (Mode mode : {ASYNC, SYNC}) {
    SCOPED_TRACE(ModeName(mode));
    ShardOptions options = Options(mode, mode == SYNC ? 2 : 1);
    options.optimizer.mutable_adam()->set_learning_rate(0.1f);
    auto shard = MakeShard(options);
    InitTwoVariables(shard.get());
    PushResponse response;
    // "w" alone would update fine; "b" overflows, so neither changes.
    absl::Status status = Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {kHuge, 0}), &response);
    if (mode == SYNC) {
      ASSERT_TRUE(status.ok()) << status;  // held for the step
      status = Push(*shard, Gradient(1, 0, {1, 1, 1, 1}, {kHuge, 0}), &response);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(response.version(), 1) << "the step completes so no worker waits forever";
      EXPECT_EQ(response.outcome(), PushResponse::SKIPPED)
          << "the worker that completed the step must learn that it changed nothing";
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(), HasSubstr("\"b\""));
    }
    EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));
    EXPECT_THAT(PullValues(shard.get(), "b"), ::testing::ElementsAre(0, 0));
    EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 1);
    if (mode == ASYNC) {
      EXPECT_EQ(StatsOf(shard.get()).workers(0).clock(), 0) << "a refused push is not counted";
    }
    // The optimizer state was not touched either: a normal step afterwards
    // is Adam's first step (alpha * m / sqrt(v) = 0.1 * g / |g|).
    const int64_t version = mode == SYNC ? 1 : 0;
    ASSERT_TRUE(Push(*shard, Gradient(0, version, {1, 1, 1, 1}, {1, 1}), &response).ok());
    if (mode == SYNC) {
      ASSERT_TRUE(Push(*shard, Gradient(1, version, {1, 1, 1, 1}, {1, 1}), &response).ok());
    }
    EXPECT_THAT(PullValues(shard.get(), "b"),
                ::testing::ElementsAre(::testing::FloatNear(-0.1f, 1e-5f),
                                       ::testing::FloatNear(-0.1f, 1e-5f)));
  }
}

// A push with no gradient in it would otherwise count as an update and
// move the version (ASYNC), unary or streamed.
TEST(ParameterShardTest, AnEmptyPushIsRefusedAndLeavesTheVersion) {
  for (Mode mode : {ASYNC, SSP, SYNC}) {
    SCOPED_TRACE(ModeName(mode));
    auto shard = MakeShard(mode, 1);
    InitTwoVariables(shard.get());
    PushRequest empty;
    empty.set_worker(0);
    PushResponse response;
    absl::Status status = Push(*shard, empty, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("no gradients"));
    absl::StatusOr<ParameterShard::StreamedPush> streamed = shard->BeginStreamedPush(empty);
    EXPECT_EQ(streamed.status().code(), absl::StatusCode::kInvalidArgument) << streamed.status();
    EXPECT_EQ(shard->version(), 0);
    EXPECT_EQ(StatsOf(shard.get()).pushes_applied(), 0);
    EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 2);
  }
}

// A pull names each variable once: naming one many times would make a
// request of a few bytes per name cost a copy of the variable per name.
TEST(ParameterShardTest, APullNamingAVariableTwiceIsRefused) {
  auto shard = MakeShard(ASYNC, 1);
  InitTwoVariables(shard.get());
  PullRequest pull;
  // Moved in as std::string: GCC 12 takes add_names(const char*), inlined
  // here, for an overlapping copy of 2^63 bytes (-Wrestrict, a false alarm).
  for (const char* name : {"w", "b", "w"}) pull.add_names(std::string(name));
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now(), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("\"w\" twice"));
  EXPECT_EQ(response.variables_size(), 0);
}

// A bound on the answer is checked before anything is encoded.
TEST(ParameterShardTest, APullWhoseAnswerIsTooLargeIsRefusedBeforeItIsBuilt) {
  auto shard = MakeShard(ASYNC, 1);
  InitTwoVariables(shard.get());  // 6 floats: 24 bytes of payload, plus framing
  PullRequest pull;
  PullResponse response;
  absl::Status status = Pull(*shard, pull, absl::Now(), &response, {.max_reply_bytes = 64});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("--max_reply_bytes"));
  EXPECT_EQ(response.variables_size(), 0);
  ASSERT_TRUE(Pull(*shard, pull, absl::Now(), &response, {.max_reply_bytes = 1 << 20}).ok());
  EXPECT_EQ(response.variables_size(), 2);
}

TEST(ParameterShardTest, PushBeforeInitIsAFailedPrecondition) {
  auto shard = MakeShard(ASYNC, 1);
  PushResponse response;
  absl::Status status = Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {1, 1}), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("before Init"));
}

// A gradient computed at a version the shard has not reached: from a
// worker that has not registered with this process, the shard went back
// to its checkpoint while the worker computed (a transient refusal: the
// worker registers again and runs its step anew); from one that has, it is
// bad input. Neither touches the model.
TEST(ParameterShardTest, AGradientAheadOfTheShardIsARestartUntilItsWorkerRegisters) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse response;
  const absl::Status unregistered = Push(*shard, Gradient(1, 5, {1, 1, 1, 1}, {1, 1}), &response);
  EXPECT_EQ(unregistered.code(), absl::StatusCode::kUnavailable) << unregistered;
  EXPECT_EQ(MarkedTransient(unregistered), TransientRefusal::kRestarting);
  EXPECT_THAT(std::string(unregistered.message()), HasSubstr("register again"));
  RegisterWorker(shard.get(), 1);
  const absl::Status registered = Push(*shard, Gradient(1, 5, {1, 1, 1, 1}, {1, 1}), &response);
  EXPECT_EQ(registered.code(), absl::StatusCode::kInvalidArgument) << registered;
  EXPECT_FALSE(MarkedTransient(registered).has_value());
  EXPECT_EQ(shard->version(), 0);
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(StatsOf(shard.get()).pushes_rejected(), 2);
}

TEST(ParameterShardTest, SecondPushForTheSameSyncStepIsRefused) {
  auto shard = MakeShard(SYNC, 2);
  InitTwoVariables(shard.get());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, Gradient(0, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  absl::Status status = Push(*shard, Gradient(0, 0, {5, 5, 5, 5}, {0, 0}), &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Push(*shard, Gradient(1, 0, {1, 1, 1, 1}, {0, 0}), &response).ok());
  EXPECT_THAT(PullValues(shard.get(), "w"), ::testing::ElementsAre(0, 1, 2, 3));
}

TEST(ParameterShardTest, BadInitsAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::string name;
    std::function<void(InitRequest*)> fill;
    std::string message;
  };
  std::vector<Case> cases = {
      {"empty", [](InitRequest*) {}, "no variables"},
      {"duplicate name",
       [](InitRequest* r) {
         AddTensor("w", {1}, {1}, r->mutable_variables());
         AddTensor("w", {1}, {1}, r->mutable_variables());
       },
       "twice"},
      {"zero dimension", [](InitRequest* r) { AddTensor("w", {0}, {}, r->mutable_variables()); },
       "non-positive dimension"},
      {"size mismatch", [](InitRequest* r) { AddTensor("w", {3}, {1, 2}, r->mutable_variables()); },
       "carries 8 bytes"},
      {"NaN value", [&](InitRequest* r) { AddTensor("w", {2}, {1, nan}, r->mutable_variables()); },
       "non-finite"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto shard = MakeShard(SYNC, 1);
    InitRequest request;
    c.fill(&request);
    InitResponse response;
    absl::Status status = shard->Init(request, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
    // Still uninitialized: a good Init is accepted afterwards.
    InitTwoVariables(shard.get());
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
