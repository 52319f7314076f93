#include "ps_server/service/ps_metrics.h"

#include <algorithm>
#include <span>

#include "common/metrics.h"
#include "common/push_outcome.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"

namespace pst {
namespace {

using metrics::CounterFamily;
using metrics::HistogramFamily;

struct ServedMetrics {
  prometheus::Histogram& pull_seconds =
      HistogramFamily("pst_ps_pull_seconds",
                      "Time to serve a Pull, waiting for the requested version included.")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Histogram& push_seconds =
      HistogramFamily("pst_ps_push_seconds", "Time to serve a Push.")
          .Add({}, metrics::LatencyBuckets());
  prometheus::Histogram& staleness =
      HistogramFamily("pst_ps_push_staleness",
                      "Versions between a gradient's computation and its arrival.")
          .Add({}, metrics::StalenessBuckets());
  prometheus::Counter& bytes_in =
      CounterFamily("pst_ps_received_bytes_total",
                    "Bytes of Push requests received (serialized protobuf).")
          .Add({});
  prometheus::Counter& bytes_out =
      CounterFamily("pst_ps_sent_bytes_total", "Bytes of Pull responses sent (serialized protobuf).")
          .Add({});
  prometheus::Counter& failed_calls =
      CounterFamily("pst_ps_failed_calls_total", "Pull and Push calls answered with an error.")
          .Add({});
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
  m.bytes_out.Increment(static_cast<double>(bytes_sent));
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
  m.bytes_in.Increment(static_cast<double>(bytes_in));
  if (!status.ok()) {
    m.failed_calls.Increment();
    return;
  }
  m.staleness.Observe(static_cast<double>(PushStaleness(computed_at_version, response)));
}

namespace {

struct Read {
  const char* name;
  const char* help;
  prometheus::MetricType type;
  double (*value)(const StatsResponse&);
};

constexpr auto kCounter = prometheus::MetricType::Counter;
constexpr auto kGauge = prometheus::MetricType::Gauge;

// The shard's own figures: one series each.
constexpr Read kShardReads[] = {
    {"pst_ps_pushes_applied_total", "Gradients applied to the model (SYNC: steps completed).",
     kCounter, [](const StatsResponse& s) { return double(s.pushes_applied()); }},
    {"pst_ps_pushes_aggregated_total", "SYNC gradients held for the step's average.", kCounter,
     [](const StatsResponse& s) { return double(s.pushes_aggregated()); }},
    {"pst_ps_pushes_dropped_total", "Gradients dropped as too late (SYNC) or too stale.", kCounter,
     [](const StatsResponse& s) { return double(s.pushes_dropped()); }},
    {"pst_ps_pushes_rejected_total", "Pushes refused as invalid.", kCounter,
     [](const StatsResponse& s) { return double(s.pushes_rejected()); }},
    {"pst_ps_pushes_repeated_total",
     "Repeats of pushes already taken, sent again after a failover and not applied.", kCounter,
     [](const StatsResponse& s) { return double(s.pushes_repeated()); }},
    {"pst_ps_version", "The shard's model version.", kGauge,
     [](const StatsResponse& s) { return double(s.version()); }},
    {"pst_ps_live_workers",
     "Workers live: heard from, and their lease has not run out (one never heard from is not).",
     kGauge, [](const StatsResponse& s) { return double(s.live_workers()); }},
    {"pst_ps_workers_done", "Workers that have finished their epochs.", kGauge,
     [](const StatsResponse& s) { return double(s.workers_done()); }},
    {"pst_ps_parameter_bytes", "Bytes of variables held by the shard.", kGauge,
     [](const StatsResponse& s) { return double(s.parameter_bytes()); }},
    {"pst_ps_checkpoints_written_total", "Checkpoints written.", kCounter,
     [](const StatsResponse& s) { return double(s.checkpoint().written()); }},
    {"pst_ps_checkpoint_failures_total", "Failed checkpoint write attempts, retries included.",
     kCounter, [](const StatsResponse& s) { return double(s.checkpoint().failures()); }},
    {"pst_ps_checkpoint_consecutive_failures",
     "Failed checkpoint writes since the last success; the PS stops at checkpoint.max_failures.",
     kGauge, [](const StatsResponse& s) { return double(s.checkpoint().consecutive_failures()); }},
    {"pst_ps_checkpoint_version", "Version of the newest checkpoint on disk (-1: none).", kGauge,
     [](const StatsResponse& s) { return double(s.checkpoint().version()); }},
    {"pst_ps_checkpoint_capture_seconds",
     "How long the last capture of the shard's state held its lock (updates waited as long).",
     kGauge, [](const StatsResponse& s) { return s.checkpoint().capture_micros() / 1e6; }},
    {"pst_ps_exchanges_refused_total",
     "Exchanges refused for load (--max_streams, --max_streams_per_worker, "
     "--max_push_buffer_bytes); the worker backs off and tries again.",
     kCounter, [](const StatsResponse& s) { return double(s.exchanges_refused()); }},
    {"pst_ps_sessions_refused_total",
     "Calls refused because another process holds the live worker they name.", kCounter,
     [](const StatsResponse& s) { return double(s.sessions_refused()); }},
    {"pst_ps_region_handoffs_refused_total",
     "Shared-memory region handoffs refused: another user, over the pending cap, past the "
     "deadline, malformed, or a descriptor the shard would not adopt.",
     kCounter, [](const StatsResponse& s) { return double(s.region_handoffs_refused()); }},
    {"pst_ps_connections_open", "TCP connections open now.", kGauge,
     [](const StatsResponse& s) { return double(s.connections_open()); }},
    {"pst_ps_connections_refused_total",
     "TCP connections reset as they were accepted (--max_connections_per_source).", kCounter,
     [](const StatsResponse& s) { return double(s.connections_refused()); }},
    {"pst_ps_connections_waited_total",
     "TCP connections that waited in the backlog at --max_connections (approximate).", kCounter,
     [](const StatsResponse& s) { return double(s.connections_waited()); }},
    {"pst_ps_descriptor_shortages_total",
     "Times accepting a connection found no descriptor free (retried 50 ms later).", kCounter,
     [](const StatsResponse& s) { return double(s.descriptor_shortages()); }},
};

// A shard with backups: series only where Stats has its replication.
constexpr Read kReplicaReads[] = {
    {"pst_ps_replica_primary", "1 while this process is its shard's primary, 0 while a backup.",
     kGauge, [](const StatsResponse& s) { return s.replication().primary() ? 1.0 : 0.0; }},
    {"pst_ps_replica_epoch", "The newest epoch of its shard this replica has seen.", kGauge,
     [](const StatsResponse& s) { return double(s.replication().epoch()); }},
    {"pst_ps_replicated_version", "The primary's version that every live backup holds.", kGauge,
     [](const StatsResponse& s) { return double(s.replication().replicated_version()); }},
    {"pst_ps_replication_lag_versions",
     "Versions the furthest live backup lags behind the primary.", kGauge,
     [](const StatsResponse& s) {
       int64_t lag = 0;
       for (const auto& b : s.replication().backups()) {
         if (b.live()) lag = std::max(lag, b.lag_versions());
       }
       return double(lag);
     }},
    {"pst_ps_replication_lag_bytes",
     "Bytes of the updates the furthest live backup has not acknowledged.", kGauge,
     [](const StatsResponse& s) {
       int64_t lag = 0;
       for (const auto& b : s.replication().backups()) {
         if (b.live()) lag = std::max(lag, b.lag_bytes());
       }
       return double(lag);
     }},
    {"pst_ps_replica_backups_live", "Backups that answer the primary.", kGauge,
     [](const StatsResponse& s) {
       int live = 0;
       for (const auto& b : s.replication().backups()) live += b.live() ? 1 : 0;
       return double(live);
     }},
    {"pst_ps_replica_chain_backups",
     "Backups in the primary's chain: they hold every acknowledged update and may take over.",
     kGauge,
     [](const StatsResponse& s) {
       int in_chain = 0;
       for (const auto& b : s.replication().backups()) in_chain += b.in_chain() ? 1 : 0;
       return double(in_chain);
     }},
    {"pst_ps_replication_forwarded_bytes_total",
     "Bytes of updates the primary logged for its "
     "backups.",
     kCounter, [](const StatsResponse& s) { return double(s.replication().bytes_forwarded()); }},
    {"pst_ps_replication_applied_bytes_total", "Bytes of its primary's updates a backup applied.",
     kCounter, [](const StatsResponse& s) { return double(s.replication().bytes_applied()); }},
    {"pst_ps_failovers_total", "Times this process became its shard's primary after it started.",
     kCounter, [](const StatsResponse& s) { return double(s.replication().became_primary()); }},
};

struct WorkerRead {
  const char* name;
  const char* help;
  prometheus::MetricType type;
  double (*value)(const WorkerStats&);
};

// Each worker the shard has heard from: one series per worker="N". The
// shard knows only the cluster's workers, so the label stays bounded.
constexpr WorkerRead kWorkerReads[] = {
    {"pst_ps_worker_pushes_total", "Gradients this worker pushed to the shard.", kCounter,
     [](const WorkerStats& w) { return double(w.pushes()); }},
    {"pst_ps_worker_pushes_dropped_total",
     "This worker's gradients the shard dropped as too late or too stale.", kCounter,
     [](const WorkerStats& w) { return double(w.dropped()); }},
    {"pst_ps_worker_staleness", "Staleness of this worker's latest push, in versions.", kGauge,
     [](const WorkerStats& w) { return double(w.last_staleness()); }},
    {"pst_ps_worker_live",
     "1 while the worker is live (heard from, within its lease); 0 before its first call and "
     "once its lease ran out.",
     kGauge, [](const WorkerStats& w) { return w.live() ? 1.0 : 0.0; }},
    {"pst_ps_worker_seconds_since_seen", "Seconds since the shard last heard from the worker.",
     kGauge, [](const WorkerStats& w) { return w.seconds_since_seen(); }},
};

struct TableRead {
  const char* name;
  const char* help;
  prometheus::MetricType type;
  double (*value)(const EmbeddingTableStats&);
};

// Each embedding table's share on this shard: one series per table="NAME".
// Tables are the model's, so the label stays bounded.
constexpr TableRead kTableReads[] = {
    {"pst_ps_table_rows", "Rows of the embedding table held by the shard.", kGauge,
     [](const EmbeddingTableStats& t) { return double(t.rows()); }},
    {"pst_ps_table_bytes",
     "Memory the table's rows take on the shard: values, optimizer state, ids, index.", kGauge,
     [](const EmbeddingTableStats& t) { return double(t.bytes()); }},
    {"pst_ps_table_rows_admitted_total", "Rows of the table created on the shard.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.rows_admitted()); }},
    {"pst_ps_table_rows_refused_total",
     "New rows refused at the table's row limit (their gradients dropped).", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.rows_refused()); }},
    {"pst_ps_table_rows_evicted_total",
     "Rows of the table dropped to make room at its row limit (the least recently updated).",
     kCounter, [](const EmbeddingTableStats& t) { return double(t.rows_evicted()); }},
    {"pst_ps_table_rows_in_memory", "Rows of the table the shard holds in RAM.", kGauge,
     [](const EmbeddingTableStats& t) { return double(t.rows_in_memory()); }},
    {"pst_ps_table_rows_on_disk", "Rows of the table in the shard's disk tier.", kGauge,
     [](const EmbeddingTableStats& t) { return double(t.rows_on_disk()); }},
    {"pst_ps_table_disk_bytes",
     "Bytes of the table's disk tier on the shard: SST files and memtables.", kGauge,
     [](const EmbeddingTableStats& t) { return double(t.disk_bytes()); }},
    {"pst_ps_table_lookups_in_memory_total",
     "Row reads (pulls and updates) of the table that RAM answered.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.lookups_in_memory()); }},
    {"pst_ps_table_disk_reads_total",
     "Row reads of the table that missed RAM and asked the disk tier.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.disk_reads()); }},
    {"pst_ps_table_disk_read_hits_total", "Row reads of the table that the disk tier answered.",
     kCounter, [](const EmbeddingTableStats& t) { return double(t.disk_read_hits()); }},
    {"pst_ps_table_rows_prefetched_total",
     "Rows of the table read from the disk tier ahead of the call that needs them.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.rows_prefetched()); }},
    {"pst_ps_table_prefetch_hits_total",
     "Row reads of the table that missed RAM and found the row read ahead.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.prefetch_hits()); }},
    {"pst_ps_table_disk_waits_total",
     "Row reads of the table that missed RAM and waited for the disk tier.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.disk_waits()); }},
    {"pst_ps_table_disk_reads_filtered_total",
     "Row reads of the table that missed RAM, of ids its disk tier never stored, answered "
     "without a read.",
     kCounter, [](const EmbeddingTableStats& t) { return double(t.disk_reads_filtered()); }},
    {"pst_ps_table_rows_demoted_total", "Rows of the table moved from RAM to disk to make room.",
     kCounter, [](const EmbeddingTableStats& t) { return double(t.rows_demoted()); }},
    {"pst_ps_table_rows_promoted_total",
     "Rows of the table moved from disk to RAM by an update that trains them.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.rows_promoted()); }},
    {"pst_ps_table_rows_expired_total",
     "Rows of the table deleted after ttl_steps of its updates untouched.", kCounter,
     [](const EmbeddingTableStats& t) { return double(t.rows_expired()); }},
};

prometheus::ClientMetric Sample(prometheus::MetricType type, double value,
                                const prometheus::Labels& labels) {
  prometheus::ClientMetric metric;
  for (const auto& [name, label_value] : labels) metric.label.push_back({name, label_value});
  if (type == kCounter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return metric;
}

class ShardStatsCollector : public prometheus::Collectable {
 public:
  ShardStatsCollector(prometheus::Labels labels, std::function<StatsResponse()> stats)
      : labels_(std::move(labels)), stats_(std::move(stats)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const StatsResponse snapshot = stats_();
    std::vector<prometheus::MetricFamily> families;
    for (const Read& read : kShardReads) {
      families.push_back({read.name, read.help, read.type, {}});
      families.back().metric.push_back(Sample(read.type, read.value(snapshot), labels_));
    }
    for (const Read& read : snapshot.has_replication() ? std::span<const Read>(kReplicaReads)
                                                       : std::span<const Read>()) {
      families.push_back({read.name, read.help, read.type, {}});
      families.back().metric.push_back(Sample(read.type, read.value(snapshot), labels_));
    }
    for (const WorkerRead& read : kWorkerReads) {
      families.push_back({read.name, read.help, read.type, {}});
      for (const WorkerStats& worker : snapshot.workers()) {
        prometheus::Labels labels = labels_;
        labels["worker"] = std::to_string(worker.worker());
        families.back().metric.push_back(Sample(read.type, read.value(worker), labels));
      }
    }
    for (const TableRead& read : kTableReads) {
      families.push_back({read.name, read.help, read.type, {}});
      for (const EmbeddingTableStats& table : snapshot.embeddings()) {
        prometheus::Labels labels = labels_;
        labels["table"] = table.table();
        families.back().metric.push_back(Sample(read.type, read.value(table), labels));
      }
    }
    return families;
  }

 private:
  const prometheus::Labels labels_;
  const std::function<StatsResponse()> stats_;
};

}  // namespace

std::shared_ptr<const prometheus::Collectable> ShardStatsMetrics(
    prometheus::Labels labels, std::function<StatsResponse()> stats) {
  return std::make_shared<ShardStatsCollector>(std::move(labels), std::move(stats));
}

void ExportShardMetrics(std::function<StatsResponse()> stats) {
  Served();  // the served-call metrics appear from the first scrape on, at zero
  metrics::GlobalExposition().Add(ShardStatsMetrics(metrics::ProcessLabels(), std::move(stats)));
}

}  // namespace pst
