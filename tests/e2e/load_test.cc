// Load: 32 concurrent workers, each with its own gRPC channel, pull and push
// in ASYNC mode against one PS for a bounded time. Every push is a gradient
// of exactly -1 with SGD at learning rate 1, so each parameter must end at
// its initial value plus the number of acknowledged pushes: a lost or
// doubled update shows exactly. Memory must stay flat after warm-up.
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps_server/parameter_shard.h"
#include "ps_server/ps_service.h"
#include "worker/mlp.h"
#include "worker/ps_client.h"

namespace pst {
namespace {

constexpr int kWorkers = 32;
constexpr int64_t kElements = 16384;  // 64 KiB per variable

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(LoadTest, ThirtyTwoAsyncWorkersLoseAndDoubleNothing) {
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = kWorkers;
  options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
  auto shard = ParameterShard::Create(options);
  ASSERT_TRUE(shard.ok());
  auto server = StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", server->port);
  const std::vector<VariableSpec> variables = {{"a", {kElements}}, {"b", {128, kElements / 128}}};

  std::atomic<int64_t> acknowledged{0};
  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  auto worker = [&](int rank) {
    auto client = PsClient::Connect({address}, rank, absl::Seconds(10));
    if (!client.ok()) {
      ++failures;
      return;
    }
    (*client)->SetVariables(variables);
    std::vector<float> zeros(kElements, 0.0f);
    if (!(*client)->Init({zeros, zeros}).ok()) ++failures;
    std::vector<float> a(kElements), b(kElements), minus_one(kElements, -1.0f);
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    while (!stop.load()) {
      if (!(*client)->Pull({0}, absl::Seconds(10), {a, b}, &versions).ok() ||
          !(*client)->Push(versions, {minus_one, minus_one}, &responses).ok()) {
        ++failures;
        return;
      }
      if (responses[0].outcome() == PushResponse::APPLIED) ++acknowledged;
    }
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorkers; ++rank) threads.emplace_back(worker, rank);
  absl::SleepFor(absl::Seconds(2));  // warm-up: channels, buffers, allocator pools
  const int64_t warm_bytes = ResidentBytes();
  // Two more measurements: growth that continues from the first to the
  // second interval is a leak, a one-off step is an allocator settling.
  absl::SleepFor(absl::Seconds(3));
  const int64_t middle_bytes = ResidentBytes();
  absl::SleepFor(absl::Seconds(3));
  const int64_t end_bytes = ResidentBytes();
  stop = true;
  for (std::thread& t : threads) t.join();

  ASSERT_EQ(failures.load(), 0);
  StatsResponse stats;
  (*shard)->Stats(&stats);
  EXPECT_GT(acknowledged.load(), kWorkers * 10);
  EXPECT_EQ(stats.pushes_applied(), acknowledged.load());
  EXPECT_EQ(stats.version(), acknowledged.load());
  EXPECT_EQ(stats.pushes_rejected(), 0);
  PullRequest pull;
  PullResponse pulled;
  ASSERT_TRUE((*shard)->Pull(pull, absl::Now(), &pulled).ok());
  const float expected = static_cast<float>(acknowledged.load());
  for (const Tensor& t : pulled.variables()) {
    const float* values = reinterpret_cast<const float*>(t.data().data());
    for (int64_t i = 0; i < kElements; ++i) {
      ASSERT_EQ(values[i], expected) << t.name() << "[" << i << "]";
    }
  }
  // Flat memory: growth after warm-up stays small next to what moved (each
  // round trip moves 256 KiB, so thousands of them went through).
  std::printf("load: %lld pushes by %d workers; RSS %.1f MiB after warm-up, %.1f MiB at 5 s, "
              "%.1f MiB at 8 s\n",
              static_cast<long long>(acknowledged.load()), kWorkers, warm_bytes / 1048576.0,
              middle_bytes / 1048576.0, end_bytes / 1048576.0);
  EXPECT_LT(end_bytes - warm_bytes, 32 << 20);
  EXPECT_LT(end_bytes - middle_bytes, 8 << 20);
  (*shard)->BeginShutdown();
  server->grpc_server->Shutdown();
}

}  // namespace
}  // namespace pst
