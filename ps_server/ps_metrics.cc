#include "ps_server/ps_metrics.h"

#include "common/metrics.h"
#include "common/push_outcome.h"
#include "ps_server/parameter_shard.h"

namespace pst {
namespace {

using metrics::GlobalRegistry;

struct ServedMetrics {
  metrics::Histogram& pull_seconds = GlobalRegistry().AddHistogram(
      "pst_ps_pull_seconds", "Time to serve a Pull, waiting for the requested version included.",
      metrics::LatencyBuckets());
  metrics::Histogram& push_seconds = GlobalRegistry().AddHistogram(
      "pst_ps_push_seconds", "Time to serve a Push.", metrics::LatencyBuckets());
  metrics::Histogram& staleness = GlobalRegistry().AddHistogram(
      "pst_ps_push_staleness", "Versions between a gradient's computation and its arrival.",
      metrics::StalenessBuckets());
  metrics::Counter& bytes_in = GlobalRegistry().AddCounter(
      "pst_ps_received_bytes_total", "Bytes of Push requests received (serialized protobuf).");
  metrics::Counter& bytes_out = GlobalRegistry().AddCounter(
      "pst_ps_sent_bytes_total", "Bytes of Pull responses sent (serialized protobuf).");
  metrics::Counter& failed_calls = GlobalRegistry().AddCounter(
      "pst_ps_failed_calls_total", "Pull and Push calls answered with an error.");
};

ServedMetrics& Served() {
  static ServedMetrics* served = new ServedMetrics();
  return *served;
}

}  // namespace

void RecordServedPull(size_t bytes_sent, const absl::Status& status, absl::Duration latency) {
  ServedMetrics& m = Served();
  m.pull_seconds.Observe(absl::ToDoubleSeconds(latency));
  if (!status.ok()) {
    m.failed_calls.Increment();
    return;
  }
  m.bytes_out.Increment(bytes_sent);
}

int64_t PushStaleness(int64_t computed_at, const PushResponse& response) {
  const int64_t arrival_version =
      response.version() - (AdvancedTheVersion(response.outcome()) ? 1 : 0);
  return arrival_version - computed_at;
}

void RecordServedPush(int64_t bytes_in, int64_t computed_at_version,
                      const PushResponse& response, const absl::Status& status,
                      absl::Duration latency) {
  ServedMetrics& m = Served();
  m.push_seconds.Observe(absl::ToDoubleSeconds(latency));
  m.bytes_in.Increment(bytes_in);
  if (!status.ok()) {
    m.failed_calls.Increment();
    return;
  }
  m.staleness.Observe(static_cast<double>(PushStaleness(computed_at_version, response)));
}

void ExportShardMetrics(std::function<StatsResponse()> stats) {
  Served();  // the served-call metrics appear from the first scrape on, at zero
  ExportShardMetrics(&GlobalRegistry(), std::move(stats));
}

void ExportShardMetrics(metrics::Registry* registry, std::function<StatsResponse()> stats) {
  struct Read {
    const char* name;
    const char* help;
    metrics::Type type;
    double (*value)(const StatsResponse&);
  };
  static constexpr Read kReads[] = {
      {"pst_ps_pushes_applied_total", "Gradients applied to the model (SYNC: steps completed).",
       metrics::Type::kCounter, [](const StatsResponse& s) { return double(s.pushes_applied()); }},
      {"pst_ps_pushes_aggregated_total", "SYNC gradients held for the step's average.",
       metrics::Type::kCounter,
       [](const StatsResponse& s) { return double(s.pushes_aggregated()); }},
      {"pst_ps_pushes_dropped_total", "Gradients dropped as too late (SYNC) or too stale.",
       metrics::Type::kCounter, [](const StatsResponse& s) { return double(s.pushes_dropped()); }},
      {"pst_ps_pushes_rejected_total", "Pushes refused as invalid.", metrics::Type::kCounter,
       [](const StatsResponse& s) { return double(s.pushes_rejected()); }},
      {"pst_ps_version", "The shard's model version.", metrics::Type::kGauge,
       [](const StatsResponse& s) { return double(s.version()); }},
      {"pst_ps_live_workers", "Workers in the live set (heard from within the lease).",
       metrics::Type::kGauge, [](const StatsResponse& s) { return double(s.live_workers()); }},
      {"pst_ps_workers_done", "Workers that have finished their epochs.", metrics::Type::kGauge,
       [](const StatsResponse& s) { return double(s.workers_done()); }},
      {"pst_ps_parameter_bytes", "Bytes of variables held by the shard.", metrics::Type::kGauge,
       [](const StatsResponse& s) { return double(s.parameter_bytes()); }},
      {"pst_ps_checkpoints_written_total", "Checkpoints written.", metrics::Type::kCounter,
       [](const StatsResponse& s) { return double(s.checkpoint().written()); }},
      {"pst_ps_checkpoint_failures_total", "Failed checkpoint write attempts, retries included.",
       metrics::Type::kCounter, [](const StatsResponse& s) { return double(s.checkpoint().failures()); }},
      {"pst_ps_checkpoint_consecutive_failures",
       "Failed checkpoint writes since the last success; the PS stops at checkpoint.max_failures.",
       metrics::Type::kGauge,
       [](const StatsResponse& s) { return double(s.checkpoint().consecutive_failures()); }},
      {"pst_ps_checkpoint_version", "Version of the newest checkpoint on disk (-1: none).",
       metrics::Type::kGauge, [](const StatsResponse& s) { return double(s.checkpoint().version()); }},
      {"pst_ps_exchanges_refused_total",
       "Exchanges refused for load (--max_streams, --max_streams_per_worker, "
       "--max_push_buffer_bytes); the worker backs off and tries again.",
       metrics::Type::kCounter, [](const StatsResponse& s) { return double(s.exchanges_refused()); }},
      {"pst_ps_sessions_refused_total",
       "Calls refused because another process holds the live worker they name.",
       metrics::Type::kCounter, [](const StatsResponse& s) { return double(s.sessions_refused()); }},
      {"pst_ps_connections_open", "TCP connections open now.", metrics::Type::kGauge,
       [](const StatsResponse& s) { return double(s.connections_open()); }},
      {"pst_ps_connections_refused_total",
       "TCP connections reset as they were accepted (--max_connections_per_source).",
       metrics::Type::kCounter,
       [](const StatsResponse& s) { return double(s.connections_refused()); }},
      {"pst_ps_connections_waited_total",
       "TCP connections that waited in the backlog at --max_connections (approximate).",
       metrics::Type::kCounter,
       [](const StatsResponse& s) { return double(s.connections_waited()); }},
      {"pst_ps_descriptor_shortages_total",
       "Times accepting a connection found no descriptor free (retried 50 ms later).",
       metrics::Type::kCounter,
       [](const StatsResponse& s) { return double(s.descriptor_shortages()); }},
  };
  std::vector<metrics::Registry::Collected> collected;
  for (const Read& read : kReads) collected.push_back({read.name, read.help, read.type});
  registry->AddCollector(collected, [stats = std::move(stats)] {
    const StatsResponse snapshot = stats();
    std::vector<double> values;
    for (const Read& read : kReads) values.push_back(read.value(snapshot));
    return values;
  });
}

}  // namespace pst
