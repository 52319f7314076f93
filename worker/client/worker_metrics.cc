#include "worker/client/worker_metrics.h"

#include <algorithm>
#include <cmath>

#include "common/push_outcome.h"

namespace pst {

using metrics::CounterFamily;
using metrics::GaugeFamily;
using metrics::HistogramFamily;

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

WorkerMetrics& GetWorkerMetrics() {
  static WorkerMetrics* m = new WorkerMetrics{
      HistogramFamily("pst_worker_pull_seconds",
                      "Time of a Pull from every shard (first step, after a reconnect, before an "
                      "evaluation), waiting included.")
          .Add({}, metrics::LatencyBuckets()),
      HistogramFamily("pst_worker_push_seconds",
                      "Time of a step's exchange with every shard: the Push and the new "
                      "parameters that come back in the same call (PushPull), waiting included.")
          .Add({}, metrics::LatencyBuckets()),
      HistogramFamily("pst_worker_step_seconds", "Time of one training step: compute and exchange.")
          .Add({}, metrics::LatencyBuckets()),
      CounterFamily("pst_worker_steps_total", "Training steps completed.").Add({}),
      CounterFamily("pst_worker_samples_total", "Training examples processed.").Add({}),
      CounterFamily("pst_worker_received_bytes_total",
                    "Bytes of Pull responses received (serialized protobuf).")
          .Add({}),
      CounterFamily("pst_worker_sent_bytes_total",
                    "Bytes of Push requests sent (serialized protobuf).")
          .Add({}),
      GaugeFamily("pst_worker_samples_per_second",
                  "Training throughput over the last progress window.")
          .Add({}),
      GaugeFamily("pst_worker_loss", "Mean training loss over the last progress window.").Add({}),
      {&HistogramFamily("pst_worker_push_staleness",
                        "Versions between computing a gradient and its arrival at the shard."),
       "shard", metrics::StalenessBuckets()},
      {&CounterFamily("pst_worker_pushes_dropped_total",
                      "Pushes the shard dropped as too late or too stale."),
       "shard"},
      {&GaugeFamily("pst_worker_version", "The shard's version at the last pull or exchange."),
       "shard"},
      GaugeFamily("pst_worker_gradient_norm",
                  "L2 norm of the variable's gradient, at the end of the last progress window."),
  };
  return *m;
}

// The same rule as the PS's (ps_server/service/ps_metrics.h), from the worker's side.
int64_t StalenessOf(int64_t computed_at, const PushResponse& response) {
  const int64_t arrival_version =
      response.version() - (AdvancedTheVersion(response.outcome()) ? 1 : 0);
  // A repeat's version is its first sending's, which may precede this one.
  return std::max<int64_t>(0, arrival_version - computed_at);
}

int64_t RecordPushes(const std::vector<int64_t>& computed_at,
                     const std::vector<PushResponse>& responses) {
  WorkerMetrics& m = GetWorkerMetrics();
  for (size_t s = 0; s < responses.size(); ++s) {
    const int shard = static_cast<int>(s);
    m.staleness[shard].Observe(static_cast<double>(StalenessOf(computed_at[s], responses[s])));
    // Looked up on every push, so each shard's count is scraped from the
    // first step on, at zero.
    prometheus::Counter& dropped = m.pushes_dropped[shard];
    if (responses[s].outcome() == PushResponse::DROPPED) dropped.Increment();
  }
  return responses.empty() ? 0 : StalenessOf(computed_at[0], responses[0]);
}

void RecordVersions(const std::vector<int64_t>& versions) {
  WorkerMetrics& m = GetWorkerMetrics();
  for (size_t s = 0; s < versions.size(); ++s) {
    m.version[static_cast<int>(s)].Set(static_cast<double>(versions[s]));
  }
}

void RecordGradientNorms(const std::vector<std::string>& names,
                         const std::vector<std::span<const float>>& gradients) {
  WorkerMetrics& m = GetWorkerMetrics();
  for (size_t i = 0; i < names.size() && i < gradients.size(); ++i) {
    double squares = 0;
    for (float g : gradients[i]) squares += static_cast<double>(g) * g;
    m.gradient_norm.Add({{"variable", names[i]}}).Set(std::sqrt(squares));
  }
}

}  // namespace pst
