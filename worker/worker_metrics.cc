#include "worker/worker_metrics.h"

#include "common/push_outcome.h"

namespace pst {

using metrics::GlobalRegistry;

WorkerMetrics& GetWorkerMetrics() {
  static WorkerMetrics* m = new WorkerMetrics{
      GlobalRegistry().AddHistogram(
          "pst_worker_pull_seconds",
          "Time of a Pull from every shard (first step, after a reconnect, before an "
          "evaluation), waiting included.",
          metrics::LatencyBuckets()),
      GlobalRegistry().AddHistogram(
          "pst_worker_push_seconds",
          "Time of a step's exchange with every shard: the Push and the new parameters that "
          "come back in the same call (PushPull), waiting included.",
          metrics::LatencyBuckets()),
      GlobalRegistry().AddHistogram("pst_worker_step_seconds",
                                    "Time of one training step: compute and exchange.",
                                    metrics::LatencyBuckets()),
      GlobalRegistry().AddHistogram("pst_worker_push_staleness",
                                    "Versions between computing a gradient and its arrival.",
                                    metrics::StalenessBuckets()),
      GlobalRegistry().AddCounter("pst_worker_steps_total", "Training steps completed."),
      GlobalRegistry().AddCounter("pst_worker_samples_total", "Training examples processed."),
      GlobalRegistry().AddCounter("pst_worker_pushes_dropped_total",
                                  "Pushes a shard dropped as too late or too stale."),
      GlobalRegistry().AddCounter("pst_worker_received_bytes_total",
                                  "Bytes of Pull responses received (serialized protobuf)."),
      GlobalRegistry().AddCounter("pst_worker_sent_bytes_total",
                                  "Bytes of Push requests sent (serialized protobuf)."),
      GlobalRegistry().AddGauge("pst_worker_samples_per_second",
                                "Training throughput over the last progress window."),
      GlobalRegistry().AddGauge("pst_worker_loss",
                                "Mean training loss over the last progress window."),
      GlobalRegistry().AddGauge("pst_worker_version", "Shard 0's version at the last pull."),
  };
  return *m;
}

// The same rule as the PS's (ps_server/ps_metrics.h), from the worker's side.
int64_t StalenessOf(int64_t computed_at, const PushResponse& response) {
  const int64_t arrival_version =
      response.version() - (AdvancedTheVersion(response.outcome()) ? 1 : 0);
  return arrival_version - computed_at;
}

int64_t RecordPushes(const std::vector<int64_t>& computed_at,
                     const std::vector<PushResponse>& responses) {
  WorkerMetrics& m = GetWorkerMetrics();
  for (size_t s = 0; s < responses.size(); ++s) {
    m.staleness.Observe(static_cast<double>(StalenessOf(computed_at[s], responses[s])));
    if (responses[s].outcome() == PushResponse::DROPPED) m.pushes_dropped.Increment();
  }
  return responses.empty() ? 0 : StalenessOf(computed_at[0], responses[0]);
}

}  // namespace pst
