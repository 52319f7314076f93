// A worker's shared region as the served shard keeps it: each worker's own,
// one exchange at a time, attached again, refused without its proof or
// with shared memory off.
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

using ::testing::Each;
using ::testing::Eq;
using namespace shm_testing;  // NOLINT(build/namespaces)

TEST_F(ShmExchangeTest, RegionsAreEachWorkersOwn) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 1, &handle).ok());
  ExchangeOutcome response;
  // Worker 0 names worker 1's region.
  EXPECT_EQ(Exchange(PushPull(handle, 0, kBytes), &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Exchange(PushPull(handle + 1, 0, kBytes), &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ExpectModelUntouched();
}

// A worker makes one exchange at a time; a second on the same region while
// the first is still in the shard (a call the worker gave up on) waits for
// it, so exchanges never make the shard buffer more than one region's
// worth per worker.
TEST_F(ShmExchangeTest, ARegionServesOneExchangeAtATime) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  PullRequest pull;  // a pull of a version that does not come
  pull.set_min_version(5);
  pull.set_timeout_ms(60000);
  ExchangeChunk waiting = PullOnly(pull);
  waiting.mutable_shm()->set_region(handle);
  grpc::ClientContext first_context;
  grpc::Status first_status;
  std::thread first([&] {
    auto stream = stub_->Exchange(&first_context);
    stream->Write(waiting);
    stream->WritesDone();
    ExchangeAnswer answer;
    while (stream->Read(&answer)) {
    }
    first_status = stream->Finish();
  });
  ASSERT_TRUE(Eventually([&] { return shard_->waiting_pulls() > 0; }, absl::Seconds(60)));

  Fill(*region, 0, 0.25f);
  grpc::Status second_status;
  std::thread second([&] {
    ExchangeOutcome response;
    second_status = Exchange(PushPull(handle, 0, kBytes), &response);
  });
  ASSERT_TRUE(
      Eventually([&] { return server_.service->shared_region_waiters() == 1; }, absl::Seconds(60)));
  ExpectModelUntouched();  // the second waits for the first

  first_context.TryCancel();
  first.join();
  second.join();
  EXPECT_EQ(first_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(second_status.ok()) << second_status.error_message();
  int64_t version = 0;
  EXPECT_THAT(Model(&version), Each(Eq(0.75f)));
  EXPECT_EQ(version, 1);
}

// An exchange waiting for a region another exchange holds is parked: it
// holds no thread, and a cancelled one is dropped with its call, so that
// any number of abandoned exchanges leaves the shard's threads as they were.
TEST_F(ShmExchangeTest, CancelledWaitsForARegionHoldNoThreads) {
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  PullRequest pull;  // holds the region: a pull of a version that does not come
  pull.set_min_version(5);
  pull.set_timeout_ms(600000);
  ExchangeChunk holding = PullOnly(pull);
  holding.mutable_shm()->set_region(handle);
  grpc::ClientContext holder_context;
  auto holder = stub_->Exchange(&holder_context);
  ASSERT_TRUE(holder->Write(holding));
  ASSERT_TRUE(Eventually([&] { return shard_->waiting_pulls() > 0; }, absl::Seconds(60)));

  const auto abandon_one = [&] {
    grpc::ClientContext context;
    auto stream = stub_->Exchange(&context);
    EXPECT_TRUE(stream->Write(PushPull(handle, 0, kBytes)));
    EXPECT_TRUE(Eventually([&] { return server_.service->shared_region_waiters() == 1; },
                           absl::Seconds(60), absl::Microseconds(100)));
    context.TryCancel();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
    return Eventually([&] { return server_.service->shared_region_waiters() == 0; },
                      absl::Seconds(60), absl::Microseconds(100));
  };
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(abandon_one()) << "a cancelled wait is still there";
  const int threads_before = ThreadCount();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(abandon_one()) << "a cancelled wait is still there after " << i;
  }
  EXPECT_LE(ThreadCount(), threads_before + 2);
  ExpectModelUntouched();

  // The region still serves its worker once the holder is gone.
  holder_context.TryCancel();
  EXPECT_EQ(holder->Finish().error_code(), grpc::StatusCode::CANCELLED);
  Fill(*region, 0, 0.25f);
  ExchangeOutcome response;
  ASSERT_TRUE(Exchange(PushPull(handle, 0, kBytes), &response).ok());
  int64_t version = 0;
  EXPECT_THAT(Model(&version), Each(Eq(0.75f)));
}

TEST_F(ShmExchangeTest, AttachingAgainReplacesTheWorkersRegion) {
  uint64_t first = 0, handle = 0;
  std::unique_ptr<SharedRegion> old_region = NewRegion();
  ASSERT_TRUE(Attach(*old_region, 0, &first).ok());
  for (int i = 0; i < 5; ++i) {
    std::unique_ptr<SharedRegion> region = NewRegion();
    ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  }
  EXPECT_EQ(server_.service->shared_regions(), 1);
  ExchangeOutcome response;
  EXPECT_EQ(Exchange(PushPull(first, 0, kBytes), &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// A local user who watches /dev/shm and offers a worker's region first,
// under any worker's id, is refused: it cannot know the region's proof. So
// the shard never maps the region for it nor writes the model into it, and
// the worker's own attach still succeeds.
TEST_F(ShmExchangeTest, ARegionOfferedWithoutItsProofIsRefused) {
  std::unique_ptr<SharedRegion> region = NewRegion(2 * kBytes, SharedRegion::Kind::kNamed);
  for (int worker : {0, 1}) {
    ShmAttachRequest request;
    request.set_worker(worker);
    request.set_name(region->name());
    request.set_bytes(static_cast<int64_t>(region->bytes().size()));
    request.set_boot_id(*HostBootId());
    ShmAttachResponse response;
    grpc::ClientContext context;
    EXPECT_EQ(stub_->ShmAttach(&context, request, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(server_.service->shared_regions(), 0);
  uint64_t handle = 0;
  ASSERT_TRUE(Attach(*region, 0, &handle).ok());
  Fill(*region, 0, 0.25f);
  ExchangeOutcome response;
  ASSERT_TRUE(Exchange(PushPull(handle, 0, kBytes), &response).ok());
  int64_t version = 0;
  EXPECT_THAT(Model(&version), Each(Eq(0.75f)));
}

TEST_F(ShmExchangeTest, AttachRefusesWhatItCannotShare) {
  std::unique_ptr<SharedRegion> region = NewRegion(2 * kBytes, SharedRegion::Kind::kNamed);
  uint64_t handle = 0;
  EXPECT_EQ(Attach(*region, 0, &handle, "not-this-host").error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Attach(*region, 2, &handle).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ShmAttachRequest request;
  request.set_worker(0);
  request.set_name("/etc/passwd");
  request.set_bytes(4096);
  request.set_boot_id(*HostBootId());
  ShmAttachResponse response;
  grpc::ClientContext context;
  EXPECT_EQ(stub_->ShmAttach(&context, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_.service->shared_regions(), 0);
}

TEST_F(ShmExchangeTest, APsWithSharedMemoryOffRefusesToAttach) {
  server_.grpc_server->Shutdown();
  Start(/*shared_memory=*/false);
  std::unique_ptr<SharedRegion> region = NewRegion();
  uint64_t handle = 0;
  EXPECT_EQ(Attach(*region, 0, &handle).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace PST_FILE_ID
}  // namespace pst
