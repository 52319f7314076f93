// Shared-memory exchanges through the gRPC service (ShmAttach, then
// Exchange with ExchangeChunk.shm): the bytes travel through a worker's
// region, and a hostile region (offsets past its end, wrong sizes, shrunk,
// NaNs) is refused with INVALID_ARGUMENT and leaves the model untouched.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/region_handoff.h"
#include "common/shared_memory.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"
#include "tests/support/thread_count.h"
#include "tests/support/exchange_calls.h"
#include "tests/ps_server/service/shm_exchange_testing.h"

namespace pst {
namespace PST_FILE_ID {

using namespace shm_testing;  // NOLINT(build/namespaces)

using ::testing::Each;
using ::testing::Eq;

TEST_F(ShmExchangeTest, PushPullMovesTheBytesThroughTheRegion) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  Fill(*region, 0, 0.25f);
  ExchangeOutcome response;
  grpc::Status status = Exchange(PushPull(handle, 0, kBytes), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.answers.size(), 1u);  // one message: the header and the outcome
  ASSERT_NE(response.done(), nullptr);
  EXPECT_EQ(response.done()->push().outcome(), PushResponse::APPLIED);
  EXPECT_EQ(response.done()->version(), 1);
  const PullResponse& header = response.answers[0].header();
  ASSERT_EQ(header.variables_size(), 1);
  EXPECT_EQ(header.variables(0).name(), "w");
  EXPECT_THAT(header.variables(0).shape(), ::testing::ElementsAre(kElements));
  EXPECT_EQ(header.variables(0).dtype(), FLOAT32);
  EXPECT_TRUE(header.variables(0).data().empty());  // the values are in the region
  EXPECT_EQ(response.answers[0].pieces_size(), 0);
  std::vector<float> answer(kElements);
  std::memcpy(answer.data(), region->bytes().data() + kBytes, kBytes);
  EXPECT_THAT(answer, Each(Eq(0.75f)));
  EXPECT_EQ(server_.service->shared_regions(), 1);
}

// An ASYNC push whose pull is the pushed variables in float32 gets the new
// values written as they are staged; any other pull is answered after the
// commit. Both answers are the committed values.
TEST_F(ShmExchangeTest, AnAnswerWrittenAsStagedEqualsOnePulledAfterTheCommit) {
  std::unique_ptr<SharedRegion> region = NewRegion(3 * kBytes);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  for (bool as_staged : {true, false}) {
    SCOPED_TRACE(as_staged);
    Fill(*region, 0, 0.25f);
    std::memset(region->bytes().data() + kBytes, 0, 2 * kBytes);
    ExchangeChunk request = PushPull(handle, 0, kBytes);
    // A 16-bit pull is encoded from the committed values instead.
    if (!as_staged) request.mutable_pull()->set_dtype(BFLOAT16);
    ExchangeOutcome response;
    ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
    ASSERT_NE(response.done(), nullptr);
    int64_t version = 0;
    const std::vector<float> model = Model(&version);
    EXPECT_EQ(response.done()->version(), version);
    std::vector<float> answer(kElements);
    if (as_staged) {
      std::memcpy(answer.data(), region->bytes().data() + kBytes, kBytes);
    } else {
      DecodeValues(absl::string_view(region->bytes().data() + kBytes, kElements * 2), BFLOAT16,
                   answer);
    }
    EXPECT_EQ(answer, model);
  }
}

TEST_F(ShmExchangeTest, APullAloneWritesTheModelIntoTheRegion) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 1, &handle).ok());
  ExchangeChunk request = PullOnly(PullRequest(), /*worker=*/1);
  request.mutable_shm()->set_region(handle);
  request.mutable_shm()->set_answer_offset(8);
  ExchangeOutcome response;
  ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
  std::vector<float> answer(kElements);
  std::memcpy(answer.data(), region->bytes().data() + 8, kBytes);
  EXPECT_THAT(answer, Each(Eq(1.0f)));
}

// In ASYNC the shard stages the push straight out of the region; in SYNC
// it reads it whole and applies it in its turn: both refuse the same.
TEST_F(ShmExchangeTest, HostileRangesAreRefusedAndLeaveTheModelUntouched) {
  for (Mode mode : {ASYNC, SYNC}) {
    SCOPED_TRACE(Mode_Name(mode));
    Restart(mode);
    std::unique_ptr<SharedRegion> region = NewRegion();
    uint64_t handle = 0;
    ASSERT_TRUE(Attach(*region, 0, &handle).ok());
    Fill(*region, 0, 0.25f);
    const int64_t size = static_cast<int64_t>(region->bytes().size());
    struct Case {
      const char* what;
      ExchangeChunk request;
    };
    const Case cases[] = {
        {"push past the end", PushPull(handle, size - kBytes + 4, 0)},
        {"negative push offset", PushPull(handle, -4, kBytes)},
        {"a gradient larger than the region", PushPull(handle, 0, kBytes, size)},
        {"an answer past the end", PushPull(handle, 0, size - kBytes + 4)},
        {"an answer at an absurd offset",
         PushPull(handle, 0, std::numeric_limits<int64_t>::max())},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      ExchangeOutcome response;
      grpc::Status status = Exchange(c.request, &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << status.error_message();
      ExpectModelUntouched();
    }
    StatsResponse stats;
    shard_->Stats(&stats);
    EXPECT_EQ(stats.pushes_rejected(), static_cast<int64_t>(std::size(cases)));
  }
}

// The answer is packed in the order its header lists the variables,
// whatever order the pull names them in, in the pull's wire type.
TEST_F(ShmExchangeTest, TheAnswerIsPackedInItsHeadersOrder) {
  constexpr int64_t kBias = 24;
  Restart(ASYNC, {{"w", kElements}, {"b", kBias}});
  std::unique_ptr<SharedRegion> region = NewRegion(4 * kBytes);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  // The push: "b" (float16, 0.5 each), then "w" (float32, 0.25 each).
  std::string b_bytes;
  EncodeValues(std::vector<float>(kBias, 0.5f), FLOAT16, &b_bytes);
  std::memcpy(region->bytes().data(), b_bytes.data(), b_bytes.size());
  Fill(*region, static_cast<int64_t>(b_bytes.size()), 0.25f);
  ExchangeChunk request;
  request.mutable_shm()->set_region(handle);
  request.mutable_shm()->set_push_offset(0);
  request.mutable_shm()->set_answer_offset(2 * kBytes);
  PushRequest* header = request.mutable_header();
  header->set_worker(0);
  Tensor* b = header->add_gradients();
  b->set_name("b");
  b->add_shape(kBias);
  b->set_dtype(FLOAT16);
  Tensor* w = header->add_gradients();
  w->set_name("w");
  w->add_shape(kElements);
  w->set_dtype(FLOAT32);
  request.mutable_pull()->add_names("w");
  request.mutable_pull()->add_names("b");
  request.mutable_pull()->set_dtype(BFLOAT16);
  ExchangeOutcome response;
  ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
  ASSERT_NE(response.done(), nullptr);
  EXPECT_EQ(response.done()->version(), 1);
  const PullResponse& answer = response.answers[0].header();
  EXPECT_EQ(answer.version(), 1);
  ASSERT_EQ(answer.variables_size(), 2);
  const char* next = region->bytes().data() + 2 * kBytes;
  for (const Tensor& variable : answer.variables()) {
    SCOPED_TRACE(variable.name());
    EXPECT_EQ(variable.dtype(), BFLOAT16);
    const int64_t elements = variable.name() == "b" ? kBias : kElements;
    std::vector<float> values(elements);
    DecodeValues(absl::string_view(next, elements * 2), BFLOAT16, values);
    EXPECT_THAT(values, Each(Eq(variable.name() == "b" ? 0.5f : 0.75f)));
    next += elements * 2;
  }
}

// A gradient's header may leave its shape out (it is the variable's): the
// push then carries, and the shard applies, the whole variable.
TEST_F(ShmExchangeTest, AGradientWithoutAShapeIsTheWholeVariable) {
  for (Mode mode : {ASYNC, SYNC}) {
    SCOPED_TRACE(Mode_Name(mode));
    Restart(mode);
    std::unique_ptr<SharedRegion> region = NewRegion();
    uint64_t handle = 0;
    ASSERT_TRUE(Attach(*region, 0, &handle).ok());
    Fill(*region, 0, 0.25f);
    ExchangeChunk request = PushPull(handle, 0, kBytes);
    request.mutable_header()->mutable_gradients(0)->clear_shape();
    request.clear_pull();
    if (mode == SYNC) {
      // The step waits for worker 1: its push of the same gradient.
      ExchangeOutcome response;
      ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
      std::unique_ptr<SharedRegion> other = NewRegion();
      uint64_t other_handle = 0;
      ASSERT_TRUE(Attach(*other, 1, &other_handle).ok());
      Fill(*other, 0, 0.25f);
      request.mutable_shm()->set_region(other_handle);
      request.mutable_header()->set_worker(1);
    }
    ExchangeOutcome response;
    ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
    int64_t version = 0;
    EXPECT_THAT(Model(&version), Each(Eq(0.75f)));
    EXPECT_EQ(version, 1);
  }
}

// SYNC takes the push whole out of the region and sums it into the step.
TEST_F(ShmExchangeTest, SyncPushesAreSummedIntoTheStep) {
  Restart(SYNC);
  for (int worker : {0, 1}) {
    std::unique_ptr<SharedRegion> region = NewRegion();
    uint64_t handle = 0;
    ASSERT_TRUE(Attach(*region, worker, &handle).ok());
    Fill(*region, 0, worker == 0 ? 0.25f : 0.75f);
    ExchangeChunk request = PushPull(handle, 0, kBytes);
    request.mutable_header()->set_worker(worker);
    request.clear_pull();  // a push alone: the step completes with the second
    ExchangeOutcome response;
    ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
  }
  int64_t version = 0;
  EXPECT_THAT(Model(&version), Each(Eq(0.5f)));  // 1 - (0.25 + 0.75) / 2
  EXPECT_EQ(version, 1);
}

TEST_F(ShmExchangeTest, AGradientOfTheWrongShapeIsRefused) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  ExchangeOutcome response;
  grpc::Status status = Exchange(PushPull(handle, 0, kBytes, kElements - 1), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  ExpectModelUntouched();
}

// A named region can shrink under the shard: its copies are refused, not
// a fault.
TEST_F(ShmExchangeTest, ANamedRegionShrunkAfterAttachingIsRefused) {
  std::unique_ptr<SharedRegion> region = NewRegion(2 * kBytes, SharedRegion::Kind::kNamed);
  // The hostile worker keeps a descriptor of its own to shrink it with.
  const int owner = shm_open(region->name().c_str(), O_RDWR, 0);
  ASSERT_GE(owner, 0);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  Fill(*region, 0, 0.25f);
  ASSERT_EQ(ftruncate(owner, 4096), 0);
  close(owner);
  ExchangeOutcome response;
  grpc::Status status = Exchange(PushPull(handle, 0, kBytes), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("shrank"), std::string::npos) << status.error_message();
  ExpectModelUntouched();
}

// The hostile worker of the test above, with a sealed region: its shrink
// fails, the shard's copies never fault, and its exchange goes through.
TEST_F(ShmExchangeTest, ASealedRegionCannotShrinkUnderTheShard) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  ASSERT_EQ(region->kind(), SharedRegion::Kind::kSealed);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  Fill(*region, 0, 0.25f);
  EXPECT_EQ(ftruncate(region->fd(), 4096), -1);
  EXPECT_EQ(errno, EPERM);
  ExchangeOutcome response;
  grpc::Status status = Exchange(PushPull(handle, 0, kBytes), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  int64_t version = 0;
  EXPECT_THAT(Model(&version), Each(Eq(0.75f)));
  std::vector<float> answer(kElements);
  std::memcpy(answer.data(), region->bytes().data() + kBytes, kBytes);
  EXPECT_THAT(answer, Each(Eq(0.75f)));
}

// A sealed attach hands out a nonce that one sealed descriptor may use,
// once: an unsealed one is refused (and spends it), as is any later one.
TEST_F(ShmExchangeTest, AnUnsealedDescriptorIsRefusedAndANonceServesOnce) {
  ShmAttachRequest request;
  request.set_worker(0);
  request.set_bytes(2 * kBytes);
  request.set_boot_id(*HostBootId());
  request.set_sealed(true);
  ShmAttachResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->ShmAttach(&context, request, &response).ok());
  ASSERT_FALSE(response.handoff_socket().empty());
  EXPECT_EQ(response.handoff_nonce().size(), kHandoffNonceBytes);
  EXPECT_EQ(response.region(), 0u);

  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed, 2 * kBytes), 0);
  absl::StatusOr<uint64_t> refused = HandOverRegion(
      response.handoff_socket(), response.handoff_nonce(), unsealed, absl::Seconds(30));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("not sealed"));
  close(unsealed);
  EXPECT_EQ(server_.service->shared_regions(), 0);

  std::unique_ptr<SharedRegion> region = NewRegion();
  absl::StatusOr<uint64_t> replayed = HandOverRegion(
      response.handoff_socket(), response.handoff_nonce(), region->fd(), absl::Seconds(30));
  EXPECT_EQ(replayed.status().code(), absl::StatusCode::kPermissionDenied) << replayed.status();
  EXPECT_EQ(server_.service->shared_regions(), 0);
  // The worker's next attach gets a nonce of its own.
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  EXPECT_EQ(server_.service->shared_regions(), 1);
}

// Refused handoffs reach Stats: a descriptor under a nonce no attach gave
// out, and a malformed message. (The inbox counts a refusal once it has
// answered, so the test waits for the count.)
TEST_F(ShmExchangeTest, RefusedHandoffsAreInStats) {
  ShmAttachRequest request;
  request.set_worker(0);
  request.set_bytes(2 * kBytes);
  request.set_boot_id(*HostBootId());
  request.set_sealed(true);
  ShmAttachResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->ShmAttach(&context, request, &response).ok());
  std::unique_ptr<SharedRegion> region = NewRegion();
  const std::string unknown_nonce(kHandoffNonceBytes, 'x');
  EXPECT_FALSE(
      HandOverRegion(response.handoff_socket(), unknown_nonce, region->fd(), absl::Seconds(30))
          .ok());
  EXPECT_FALSE(HandOverRegion(response.handoff_socket(), "short", region->fd(), absl::Seconds(30))
                   .ok());
  auto refused = [&] {
    StatsResponse stats;
    grpc::ClientContext stats_context;
    EXPECT_TRUE(stub_->Stats(&stats_context, StatsRequest(), &stats).ok());
    return stats.region_handoffs_refused();
  };
  EXPECT_TRUE(Eventually([&] { return refused() == 2; })) << refused();
}

TEST_F(ShmExchangeTest, NonFiniteGradientsInTheRegionAreRefused) {
  // float32 at an aligned offset is applied where it lies, anything else
  // from a copy: both refuse, naming the gradient and the element.
  for (int64_t push_offset : {0, 2}) {
    SCOPED_TRACE(push_offset);
    std::unique_ptr<SharedRegion> region = NewRegion(2 * kBytes + 8);
    uint64_t handle = 0;
    ASSERT_TRUE(Attach(*region, 0, &handle).ok());
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
      Fill(*region, push_offset, 0.25f);
      std::memcpy(region->bytes().data() + push_offset + 40, &bad, sizeof(bad));
      ExchangeOutcome response;
      grpc::Status status = Exchange(PushPull(handle, push_offset, kBytes + 4), &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << status.error_message();
      EXPECT_THAT(status.error_message(),
                  ::testing::HasSubstr("gradient for \"w\" has a non-finite value"));
      EXPECT_THAT(status.error_message(), ::testing::HasSubstr("element 10"));
      ExpectModelUntouched();
    }
  }
}

// A large float32 push is staged in parts on several threads at once: the
// result is the same, and a value that is not finite in a later part is
// found and named as in the first.
TEST_F(ShmExchangeTest, ALargePushStagedInPartsIsAppliedOrRefusedWhole) {
  constexpr int64_t kLarge = 300000;  // five staging blocks: parts of three and two
  constexpr int64_t kLargeBytes = kLarge * sizeof(float);
  Restart(ASYNC, {{"big", kLarge}});
  std::unique_ptr<SharedRegion> region = NewRegion(2 * kLargeBytes);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  ExchangeChunk request = PushPull(handle, 0, kLargeBytes, kLarge);
  request.mutable_header()->mutable_gradients(0)->set_name("big");
  auto model = [&](int64_t* version) {
    PullResponse response;
    EXPECT_TRUE(Pull(*shard_, PullRequest(), absl::Now(), &response).ok());
    *version = response.version();
    std::vector<float> values(kLarge);
    DecodeTensor(response.variables(0), values);
    return values;
  };
  float* gradient = reinterpret_cast<float*>(region->bytes().data());
  std::fill(gradient, gradient + kLarge, 0.25f);
  gradient[250000] = std::numeric_limits<float>::quiet_NaN();
  ExchangeOutcome response;
  grpc::Status status = Exchange(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("element 250000"));
  int64_t version = -1;
  EXPECT_THAT(model(&version), Each(Eq(1.0f)));
  EXPECT_EQ(version, 0);

  gradient[250000] = 0.25f;
  ASSERT_TRUE(Exchange(request, &response).ok()) << response.status.error_message();
  EXPECT_THAT(model(&version), Each(Eq(0.75f)));
  EXPECT_EQ(version, 1);
  const float* answer = reinterpret_cast<const float*>(region->bytes().data() + kLargeBytes);
  EXPECT_THAT(std::vector<float>(answer, answer + kLarge), Each(Eq(0.75f)));
}

// A push at an offset that is not a float's is applied from a copy, with
// the same result.
TEST_F(ShmExchangeTest, AnUnalignedPushIsAppliedAsAnAlignedOne) {
  std::unique_ptr<SharedRegion> region = NewRegion(2 * kBytes + 8);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  Fill(*region, 3, 0.25f);
  ExchangeOutcome response;
  ASSERT_TRUE(Exchange(PushPull(handle, 3, kBytes + 4), &response).ok())
      << response.status.error_message();
  int64_t version = 0;
  EXPECT_THAT(Model(&version), Each(Eq(0.75f)));
  EXPECT_EQ(version, 1);
}

// The worker may write NaNs into its region while the shard is reading it:
// the shard checks the copy it took, so each push is either refused whole
// or applied with the finite values it read, and the model stays finite.
TEST_F(ShmExchangeTest, NaNsWrittenDuringTheExchangeNeverReachTheModel) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  Fill(*region, 0, 0.0f);
  // One NaN runs through the gradient, so a read may or may not catch it.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> writes{0};
  std::thread vandal([&] {
    auto* values = reinterpret_cast<std::atomic<float>*>(region->bytes().data());
    for (int64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      values[i % kElements].store(std::numeric_limits<float>::quiet_NaN(),
                                  std::memory_order_relaxed);
      values[i % kElements].store(0.0f, std::memory_order_relaxed);
      writes.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (writes.load() == 0) std::this_thread::yield();
  int applied = 0, refused = 0;
  for (int i = 0; i < 200; ++i) {
    ExchangeOutcome response;
    grpc::Status status = Exchange(PushPull(handle, 0, kBytes), &response);
    if (status.ok()) {
      ++applied;
    } else {
      ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
      ++refused;
    }
  }
  stop = true;
  vandal.join();
  int64_t version = 0;
  for (float v : Model(&version)) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(version, applied);
  EXPECT_EQ(applied + refused, 200);
}

}  // namespace PST_FILE_ID
}  // namespace pst
