// train_bench: training throughput of the default model (MLP 784-256-128-10
// on Fashion-MNIST) with 1 and 2 workers in SYNC and ASYNC, and the
// push+pull round trip of that model, all over gRPC on loopback.
//
// Workers are threads of this process, each with its own gRPC channel, so
// the numbers include serialization and the loopback network but not
// process start-up. Prints a table, or one JSON object per row with --json.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/mutex_checks.h"
#include "rpc/grpc_experiments.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, train_limit, 20000, "Training examples per run (0 = all 60000).");
ABSL_FLAG(int, batch_per_worker, 64,
          "Examples per worker per step (the job's training.batch_size).");
ABSL_FLAG(int, round_trips, 300, "Push+pull round trips to time.");
ABSL_FLAG(int, straggler_delay_ms, 20, "Per-step delay of the straggler in the backup-worker run.");
ABSL_FLAG(bool, json, false, "Print one JSON object per row instead of a table.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST directory.");

namespace pst {
namespace {

JobConfig BenchConfig(Mode mode, int workers) {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:0");
  config.mutable_cluster()->set_workers(workers);
  TrainingConfig* t = config.mutable_training();
  t->set_mode(mode);
  t->set_batch_size(absl::GetFlag(FLAGS_batch_per_worker));
  t->set_epochs(1);
  t->set_log_every_steps(1000000);
  t->mutable_optimizer()->mutable_adam()->set_learning_rate(0.001f);
  t->mutable_model()->mutable_mlp()->add_hidden(256);
  t->mutable_model()->mutable_mlp()->add_hidden(128);
  FashionMnistConfig* fm = t->mutable_dataset()->mutable_fashion_mnist();
  fm->set_dir(absl::GetFlag(FLAGS_data_dir));
  fm->set_train_limit(absl::GetFlag(FLAGS_train_limit));
  ApplyDefaults(&config);
  return config;
}

absl::StatusOr<double> SamplesPerSecond(Mode mode, int workers, const TrainingData& data) {
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(BenchConfig(mode, workers), 1);
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<ClusterRun> run = (*cluster)->Train(data);
  if (!run.ok()) return run.status();
  int64_t samples = 0;
  double seconds = 0;
  for (const WorkerResult& r : run->results) {
    samples += r.samples();
    seconds = std::max(seconds, r.train_seconds());
  }
  return samples / seconds;
}

// SYNC with three workers, worker:2 slowed by `delay` per step. Returns the
// samples/s of the two fast workers while they ran: with every worker
// aggregated they wait for the straggler every step; with
// replicas_to_aggregate = 2 they should run at their own pace.
absl::StatusOr<double> FastWorkerRate(int replicas, absl::Duration delay, const TrainingData& data) {
  JobConfig config = BenchConfig(SYNC, 3);
  config.mutable_training()->set_replicas_to_aggregate(replicas);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster = InProcessCluster::Start(config, 1);
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<ClusterRun> run = (*cluster)->Train(data, {absl::ZeroDuration(), absl::ZeroDuration(), delay});
  if (!run.ok()) return run.status();
  int64_t samples = 0;
  double seconds = 0;
  for (int rank = 0; rank < 2; ++rank) {
    samples += run->results[rank].samples();
    seconds = std::max(seconds, run->results[rank].train_seconds());
  }
  return samples / seconds;
}

struct Latency {
  double p50_us, p99_us;
  int64_t bytes;
};

// One worker pulls the whole model and pushes a gradient for it, again and
// again, against an ASYNC shard (so no push waits for another worker).
absl::StatusOr<Latency> PushPullRoundTrip(const TrainingData& data) {
  JobConfig config = BenchConfig(ASYNC, 1);
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster = InProcessCluster::Start(config, 1);
  if (!cluster.ok()) return cluster.status();
  std::vector<std::string> addresses((*cluster)->config().cluster().ps().begin(),
                                     (*cluster)->config().cluster().ps().end());
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(addresses, 0, absl::Seconds(10));
  if (!client.ok()) return client.status();
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(ModelSpecFor(config.training(), data.train), kernels.get(), 1);
  if (!mlp.ok()) return mlp.status();
  (*client)->SetVariables((*mlp)->variables());
  if (auto r = (*client)->Register(); !r.ok()) return r.status();
  std::vector<std::vector<float>> initial = (*mlp)->InitialValues(1);
  std::vector<std::span<const float>> values(initial.begin(), initial.end());
  if (auto r = (*client)->Init(values); !r.ok()) return r.status();
  // Tiny gradients keep the parameters finite however many times they apply.
  std::vector<std::vector<float>> grads;
  std::vector<std::span<float>> params;
  std::vector<std::span<const float>> grad_spans;
  int64_t bytes = 0;
  for (size_t i = 0; i < initial.size(); ++i) {
    grads.emplace_back(initial[i].size(), 1e-9f);
    params.push_back((*mlp)->HostParameter(i));
    bytes += 2 * initial[i].size() * sizeof(float);
  }
  grad_spans.assign(grads.begin(), grads.end());
  std::vector<int64_t> versions(1, 0);
  std::vector<PushResponse> responses;
  std::vector<double> micros;
  int trips = absl::GetFlag(FLAGS_round_trips);
  for (int i = 0; i < trips + 20; ++i) {
    absl::Time start = absl::Now();
    if (auto s = (*client)->Exchange(
            {.min_versions = {0}, .timeout = absl::Seconds(10), .values = params}, &versions,
            nullptr);
        !s.ok())
      return s;
    if (auto s = (*client)->Exchange({.computed_at = versions, .gradients = grad_spans}, nullptr,
                                     &responses);
        !s.ok())
      return s;
    if (i >= 20) micros.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  std::sort(micros.begin(), micros.end());
  return Latency{micros[micros.size() / 2], micros[micros.size() * 99 / 100], bytes};
}

int Main() {
  TrainingConfig data_config = BenchConfig(SYNC, 1).training();
  absl::StatusOr<TrainingData> data = LoadTrainingData(data_config);
  if (!data.ok()) ExitWithError("train_bench", data.status());
  bool json = absl::GetFlag(FLAGS_json);
  if (!json) std::printf("%-6s %7s %14s\n", "mode", "workers", "samples/s");
  for (Mode mode : {SYNC, ASYNC}) {
    for (int workers : {1, 2}) {
      absl::StatusOr<double> rate = SamplesPerSecond(mode, workers, *data);
      if (!rate.ok()) ExitWithError("train_bench", rate.status());
      if (json) {
        std::printf("{\"mode\":\"%s\",\"workers\":%d,\"batch_size\":%d,\"samples_per_sec\":%.1f}\n",
                    ModeName(mode).c_str(), workers, absl::GetFlag(FLAGS_batch_per_worker), *rate);
      } else {
        std::printf("%-6s %7d %14.0f\n", ModeName(mode).c_str(), workers, *rate);
      }
      std::fflush(stdout);
    }
  }
  const absl::Duration delay = absl::Milliseconds(absl::GetFlag(FLAGS_straggler_delay_ms));
  if (!json) {
    std::printf("\nbackup workers: SYNC, 3 workers, worker:2 sleeps %s per step\n",
                absl::FormatDuration(delay).c_str());
    std::printf("%-24s %22s\n", "replicas_to_aggregate", "fast workers samples/s");
  }
  for (int replicas : {3, 2}) {
    absl::StatusOr<double> rate = FastWorkerRate(replicas, delay, *data);
    if (!rate.ok()) ExitWithError("train_bench", rate.status());
    if (json) {
      std::printf("{\"straggler_delay_ms\":%d,\"replicas_to_aggregate\":%d,\"fast_samples_per_sec\":%.1f}\n",
                  absl::GetFlag(FLAGS_straggler_delay_ms), replicas, *rate);
    } else {
      std::printf("%-24d %22.0f\n", replicas, *rate);
    }
    std::fflush(stdout);
  }
  absl::StatusOr<Latency> latency = PushPullRoundTrip(*data);
  if (!latency.ok()) ExitWithError("train_bench", latency.status());
  if (json) {
    std::printf("{\"push_pull_bytes\":%lld,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
                static_cast<long long>(latency->bytes), latency->p50_us, latency->p99_us);
  } else {
    std::printf("push+pull round trip of the model (%lld bytes moved): p50 %.0f us, p99 %.0f us\n",
                static_cast<long long>(latency->bytes), latency->p50_us, latency->p99_us);
  }
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::SkipMutexDeadlockChecks();
  absl::SetProgramUsageMessage(
      "Training samples/s of MLP 784-256-128-10 with 1 and 2 workers in SYNC and ASYNC, and "
      "the model's push+pull round trip, over gRPC on loopback.");
  pst::EnableTransportExperiments();
  absl::ParseCommandLine(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  return pst::Main();
}
