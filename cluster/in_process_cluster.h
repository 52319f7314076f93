// A whole cluster inside one process, for tests and benchmarks: real
// ParameterShards behind real gRPC servers on 127.0.0.1 (ports chosen by the
// kernel), and one Trainer thread per worker, each with its own client.
#ifndef PST_CLUSTER_IN_PROCESS_CLUSTER_H_
#define PST_CLUSTER_IN_PROCESS_CLUSTER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "config.pb.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/ps_service.h"
#include "result.pb.h"
#include "worker/training/trainer.h"

namespace pst {

struct ClusterRun {
  std::vector<WorkerResult> results;           // one per worker, by rank
  std::vector<std::vector<float>> parameters;  // final values, in model variable order
  std::vector<StatsResponse> stats;            // per shard, at the end
  std::vector<int> shared_regions;             // per shard: workers attached through shared memory
};

class InProcessCluster {
 public:
  // Starts `num_shards` shards for `config` (its cluster.ps is replaced by
  // the addresses actually bound), each holding its clients to `limits`.
  static absl::StatusOr<std::unique_ptr<InProcessCluster>> Start(JobConfig config, int num_shards,
                                                                 const RpcLimits& limits = {});
  ~InProcessCluster();

  const JobConfig& config() const { return config_; }

  // Trains every worker to the end on `data` and collects the outcome.
  // `step_delays[rank]`, where given, slows that worker down on purpose.
  absl::StatusOr<ClusterRun> Train(const TrainingData& data,
                                   const std::vector<absl::Duration>& step_delays = {});

  // Shard s, as it serves now.
  const ParameterShard& shard(int s) const { return *shards_[s]; }

  // Stops shard s as ps_server stops on SIGTERM: the calls waiting there
  // end with an error, and its server takes no more (its model stays until
  // the cluster goes).
  void StopShard(int s);

  // Runs `hook` on worker `rank`'s thread before each of its pushes (after
  // its step delay, if any), in the next Train.
  void set_before_push(int rank, std::function<void()> hook);

 private:
  InProcessCluster() = default;
  JobConfig config_;
  std::vector<std::unique_ptr<ParameterShard>> shards_;
  std::vector<RunningServer> servers_;
  std::vector<bool> stopped_;                       // by shard: StopShard ended its server
  std::vector<std::function<void()>> before_push_;  // by rank
};

}  // namespace pst

#endif  // PST_CLUSTER_IN_PROCESS_CLUSTER_H_
