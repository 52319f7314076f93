// Load: 32 concurrent workers, each with its own gRPC channel, pull and push
// in ASYNC mode against one PS for a fixed number of pushes. Every push is a gradient
// of exactly -1 with SGD at learning rate 1, so each parameter must end at
// its initial value plus the number of acknowledged pushes: a lost or
// doubled update shows exactly. Memory must stay flat after warm-up.
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "placement/variable_spec.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/service/ps_service.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

constexpr int kWorkers = 32;
constexpr int64_t kElements = 16384;  // 64 KiB per variable
// Memory is sampled after a warm-up (channels, buffers, allocator pools) and
// then every kPushesPerSample pushes, counted in work rather than time so
// that a slow machine puts as many round trips between the samples as a
// fast one: a leak grows with the pushes.
constexpr int64_t kWarmUpPushes = 1000;
constexpr int64_t kPushesPerSample = 250;
constexpr int kSamples = 24;

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

  std::atomic<int64_t> acknowledged{0};  // changed under `mu`
  std::atomic<int64_t> failures{0};      // changed under `mu`
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  absl::CondVar progressed;  // a push acknowledged, or a worker failed
  auto count = [&](std::atomic<int64_t>& counter) {
    {
      absl::MutexLock lock(&mu);
      ++counter;
    }
    progressed.SignalAll();
  };
  auto worker = [&](int rank) {
    auto client = PsClient::Connect({address}, rank, absl::Seconds(10));
    if (!client.ok()) {
      count(failures);
      return;
    }
    (*client)->SetVariables(variables);
    std::vector<float> zeros(kElements, 0.0f);
    if (!(*client)->Init({zeros, zeros}).ok()) count(failures);
    std::vector<float> a(kElements), b(kElements), minus_one(kElements, -1.0f);
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    while (!stop.load()) {
      absl::Status status =
          (*client)->Exchange({.min_versions = {0}, .timeout = absl::Seconds(10), .values = {a, b}},
                              &versions, nullptr);
      if (status.ok())
        status = (*client)->Exchange({.computed_at = versions, .gradients = {minus_one, minus_one}},
                                     nullptr, &responses);
      if (!status.ok()) {
        ADD_FAILURE() << "worker " << rank << ": " << status;
        count(failures);
        return;
      }
      if (responses[0].outcome() == PushResponse::APPLIED) count(acknowledged);
    }
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorkers; ++rank) threads.emplace_back(worker, rank);
  // Waits until `pushes` have been acknowledged (true), a worker failed or
  // the deadline passed.
  const absl::Time deadline = absl::Now() + absl::Seconds(80);
  auto reached = [&](int64_t pushes) {
    absl::MutexLock lock(&mu);
    while (acknowledged.load() < pushes && failures.load() == 0) {
      if (progressed.WaitWithDeadline(&mu, deadline)) break;
    }
    return acknowledged.load() >= pushes && failures.load() == 0;
  };
  // In-flight messages make single samples swing by several MiB, so
  // compare the means of the two halves: a leak raises the second half,
  // noise does not.
  std::vector<int64_t> samples;
  for (int i = 0; i < kSamples && reached(kWarmUpPushes + i * kPushesPerSample); ++i) {
    samples.push_back(ResidentBytes());
  }
  stop = true;
  for (std::thread& t : threads) t.join();

  ASSERT_EQ(failures.load(), 0);
  ASSERT_EQ(samples.size(), static_cast<size_t>(kSamples))
      << "only " << acknowledged.load() << " pushes in 80 s";
  StatsResponse stats;
  (*shard)->Stats(&stats);
  EXPECT_GT(acknowledged.load(), kWorkers * 10);
  EXPECT_EQ(stats.pushes_applied(), acknowledged.load());
  EXPECT_EQ(stats.version(), acknowledged.load());
  EXPECT_EQ(stats.pushes_rejected(), 0);
  PullRequest pull;
  PullResponse pulled;
  ASSERT_TRUE(Pull(**shard, pull, absl::Now(), &pulled).ok());
  const float expected = static_cast<float>(acknowledged.load());
  for (const Tensor& t : pulled.variables()) {
    const float* values = reinterpret_cast<const float*>(t.data().data());
    for (int64_t i = 0; i < kElements; ++i) {
      ASSERT_EQ(values[i], expected) << t.name() << "[" << i << "]";
    }
  }
  // Flat memory while thousands of 256 KiB round trips go through.
  auto mean = [](auto begin, auto end) {
    return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
  };
  const double first_half = mean(samples.begin(), samples.begin() + kSamples / 2);
  const double second_half = mean(samples.begin() + kSamples / 2, samples.end());
  std::printf("load: %lld pushes by %d workers; mean RSS %.1f MiB (first half), %.1f MiB (second "
              "half)\n",
              static_cast<long long>(acknowledged.load()), kWorkers, first_half / 1048576.0,
              second_half / 1048576.0);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer keeps freed blocks in a quarantine of up to 256 MiB, so
  // resident memory grows by design there and says nothing about ours; the
  // exactly-once invariant above is what this build checks.
#else
  // Malloc's per-thread arenas (32 workers, gRPC's threads) keep reaching
  // new high-water marks for a while: up to about 8 MiB between the halves
  // on a loaded 2-core machine. A leaked message or gradient buffer (128
  // KiB a round trip here) would add hundreds of MiB in the second half.
  EXPECT_LT(second_half - first_half, 16 << 20);
#endif
  (*shard)->BeginShutdown();
  server->grpc_server->Shutdown();
}

}  // namespace PST_FILE_ID
}  // namespace pst
