// A worker's Prometheus metrics (see common/metrics.h), on the global
// registry: client-side Pull/Push latency over all shards, step time,
// throughput, loss, staleness of its gradients and dropped pushes.
#ifndef PST_WORKER_WORKER_METRICS_H_
#define PST_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <vector>

#include "common/metrics.h"
#include "ps.pb.h"

namespace pst {

struct WorkerMetrics {
  metrics::Histogram& pull_seconds;
  metrics::Histogram& push_seconds;
  metrics::Histogram& step_seconds;
  metrics::Histogram& staleness;
  metrics::Counter& steps;
  metrics::Counter& samples;
  metrics::Counter& pushes_dropped;
  metrics::Counter& bytes_in;
  metrics::Counter& bytes_out;
  metrics::Gauge& samples_per_second;
  metrics::Gauge& loss;
  metrics::Gauge& version;
};

// Registered on first use.
WorkerMetrics& GetWorkerMetrics();

// A gradient's staleness as the shard saw it: the shard's version at arrival
// minus `computed_at` (an applied push advanced the version by one).
int64_t StalenessOf(int64_t computed_at, const PushResponse& response);

// Records one step's pushes (one response per shard, tagged `computed_at`):
// staleness and drops. Returns shard 0's staleness.
int64_t RecordPushes(const std::vector<int64_t>& computed_at,
                     const std::vector<PushResponse>& responses);

}  // namespace pst

#endif  // PST_WORKER_WORKER_METRICS_H_
