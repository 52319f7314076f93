#include "cluster/in_process_cluster.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/device_spec.h"

namespace pst {

absl::StatusOr<std::unique_ptr<InProcessCluster>> InProcessCluster::Start(
    JobConfig config, int num_shards, const RpcLimits& limits) {
  std::unique_ptr<InProcessCluster> cluster(new InProcessCluster());
  config.mutable_cluster()->clear_ps();
  for (int s = 0; s < num_shards; ++s) {
    ShardOptions options = ShardOptionsFromConfig(config, s);
    options.num_shards = num_shards;
    absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
    if (!shard.ok()) return shard.status();
    absl::StatusOr<RunningServer> server =
        StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{}, ClusterSecurity::Plaintext(),
                        limits);
    if (!server.ok()) return server.status();
    config.mutable_cluster()->add_ps(absl::StrCat("127.0.0.1:", server->port));
    cluster->shards_.push_back(std::move(*shard));
    cluster->servers_.push_back(std::move(*server));
    cluster->stopped_.push_back(false);
  }
  cluster->config_ = std::move(config);
  return cluster;
}

InProcessCluster::~InProcessCluster() {
  for (auto& shard : shards_) shard->BeginShutdown();
  for (size_t s = 0; s < servers_.size(); ++s) {
    if (!stopped_[s]) servers_[s].Shutdown();
  }
}

void InProcessCluster::StopShard(int s) {
  if (stopped_[s]) return;
  stopped_[s] = true;
  shards_[s]->BeginShutdown();
  servers_[s].Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void InProcessCluster::set_before_push(int rank, std::function<void()> hook) {
  if (before_push_.size() <= static_cast<size_t>(rank)) before_push_.resize(rank + 1);
  before_push_[rank] = std::move(hook);
}

absl::StatusOr<ClusterRun> InProcessCluster::Train(const TrainingData& data,
                                                   const std::vector<absl::Duration>& step_delays) {
  const int workers = config_.cluster().workers();
  std::vector<std::string> addresses(config_.cluster().ps().begin(), config_.cluster().ps().end());
  std::vector<absl::StatusOr<WorkerResult>> results(workers, absl::UnknownError("not run"));
  std::vector<std::unique_ptr<PsClient>> clients(workers);
  for (int rank = 0; rank < workers; ++rank) {
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(addresses, rank, absl::Seconds(10));
    if (!client.ok()) return client.status();
    (*client)->set_call_patience(absl::Seconds(config_.training().pull_timeout_seconds()));
    clients[rank] = std::move(*client);
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      // One CPU backend per tower (training.devices; the config was validated).
      absl::StatusOr<DeviceList> devices = ParseDeviceList(config_.training().devices());
      const size_t towers = devices.ok() ? std::max<size_t>(devices->towers.size(), 1) : 1;
      std::vector<std::unique_ptr<Kernels>> backends;
      std::vector<Kernels*> tower_backends;
      for (size_t t = 0; t < towers; ++t) {
        backends.push_back(MakeCpuKernels());
        tower_backends.push_back(backends.back().get());
      }
      Trainer trainer(config_, rank, clients[rank].get(), tower_backends, &data);
      const absl::Duration delay = static_cast<size_t>(rank) < step_delays.size()
                                       ? step_delays[rank]
                                       : absl::ZeroDuration();
      std::function<void()> hook = static_cast<size_t>(rank) < before_push_.size()
                                       ? before_push_[rank]
                                       : std::function<void()>();
      if (delay > absl::ZeroDuration() || hook) {
        trainer.set_before_push([delay, hook] {
          absl::SleepFor(delay);
          if (hook) hook();
        });
      }
      results[rank] = trainer.Run();
    });
  }
  for (std::thread& t : threads) t.join();

  ClusterRun run;
  for (int rank = 0; rank < workers; ++rank) {
    if (!results[rank].ok()) {
      return absl::Status(results[rank].status().code(),
                          absl::StrCat("worker:", rank, ": ", results[rank].status().message()));
    }
    run.results.push_back(std::move(*results[rank]));
  }
  // Read the final parameters back through a fresh model of the same shape.
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(ModelSpecFor(config_.training(), data.train), kernels.get(), 1);
  if (!mlp.ok()) return mlp.status();
  PsClient& client = *clients[0];
  client.SetVariables((*mlp)->variables());
  std::vector<std::span<float>> out;
  for (size_t i = 0; i < (*mlp)->variables().size(); ++i) out.push_back((*mlp)->HostParameter(i));
  std::vector<int64_t> versions;
  if (absl::Status s =
          client.Exchange({.min_versions = std::vector<int64_t>(client.num_shards(), 0),
                           .timeout = absl::Seconds(10),
                           .values = out},
                          &versions, nullptr);
      !s.ok()) {
    return s;
  }
  for (auto& span : out) run.parameters.emplace_back(span.begin(), span.end());
  for (int s = 0; s < client.num_shards(); ++s) {
    absl::StatusOr<StatsResponse> stats = client.Stats(s);
    if (!stats.ok()) return stats.status();
    run.stats.push_back(*stats);
    run.shared_regions.push_back(servers_[s].service->shared_regions());
  }
  return run;
}

}  // namespace pst
