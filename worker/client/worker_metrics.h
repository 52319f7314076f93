// A worker's Prometheus metrics (see common/metrics.h), on the global
// registry with the process's labels (task="worker:N" worker="N"):
// client-side Pull/Push latency over all shards, step time, throughput,
// loss; per shard (shard="S") the staleness of its gradients, the pushes
// the shard dropped and the shard's version; per variable (variable="NAME")
// the gradient's norm.
#ifndef PST_WORKER_CLIENT_WORKER_METRICS_H_
#define PST_WORKER_CLIENT_WORKER_METRICS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "ps.pb.h"

namespace pst {

struct WorkerMetrics {
  prometheus::Histogram& pull_seconds;
  prometheus::Histogram& push_seconds;
  prometheus::Histogram& step_seconds;
  prometheus::Counter& steps;
  prometheus::Counter& samples;
  prometheus::Counter& bytes_in;
  prometheus::Counter& bytes_out;
  prometheus::Gauge& samples_per_second;
  prometheus::Gauge& loss;
  metrics::SeriesByIndex<prometheus::Histogram, std::vector<double>> staleness;  // by shard
  metrics::SeriesByIndex<prometheus::Counter> pushes_dropped;                    // by shard
  metrics::SeriesByIndex<prometheus::Gauge> version;                             // by shard
  prometheus::Family<prometheus::Gauge>& gradient_norm;                          // by variable
};

// Registered on first use, with the labels metrics::SetProcessLabels gave.
WorkerMetrics& GetWorkerMetrics();

// Seconds from `start` to now, as the histograms above take them.
double SecondsSince(absl::Time start);

// A gradient's staleness as the shard saw it: the shard's version at arrival
// minus `computed_at` (an applied push advanced the version by one).
int64_t StalenessOf(int64_t computed_at, const PushResponse& response);

// Records one step's pushes (one response per shard, tagged `computed_at`):
// staleness and drops, per shard. Returns shard 0's staleness.
int64_t RecordPushes(const std::vector<int64_t>& computed_at,
                     const std::vector<PushResponse>& responses);

// Each shard's version after a pull or an exchange (`versions[s]` of shard s).
void RecordVersions(const std::vector<int64_t>& versions);

// The L2 norm of each variable's gradient (`gradients[i]` of `names[i]`):
// one pass over the gradients, so the trainer records it once per progress
// window, not every step.
void RecordGradientNorms(const std::vector<std::string>& names,
                         const std::vector<std::span<const float>>& gradients);

}  // namespace pst

#endif  // PST_WORKER_CLIENT_WORKER_METRICS_H_
