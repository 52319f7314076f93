// The PS's Prometheus metrics (see common/metrics.h): latency and size of
// the Pull and Push calls it serves and the staleness of each gradient,
// recorded by the gRPC service; the shard's push counters, version, live
// workers, each worker's standing (labelled worker="N") and each embedding
// table's rows and memory (labelled table="NAME"), read from one
// ParameterShard::Stats snapshot per scrape (Stats changes nothing, and
// every gauge of a scrape agrees with the others). All carry the process's
// labels (task="ps:N" shard="N").
#ifndef PST_PS_SERVER_SERVICE_PS_METRICS_H_
#define PST_PS_SERVER_SERVICE_PS_METRICS_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "ps.pb.h"

namespace pst {

class ParameterShard;

// One served Pull: its time in the service (the long-poll wait included)
// and, when it succeeded, the bytes sent.
void RecordServedPull(size_t bytes_sent, const absl::Status& status, absl::Duration latency);

// One served Push: its time, the bytes received and, when it was accepted
// (applied, aggregated or dropped), the gradient's staleness.
void RecordServedPush(int64_t bytes_in, int64_t computed_at_version,
                      const PushResponse& response, const absl::Status& status,
                      absl::Duration latency);

// A Push's staleness: the shard's version when it arrived minus the version
// it was computed at, recovered from the response (an applied push advanced
// the version by one).
int64_t PushStaleness(int64_t computed_at, const PushResponse& response);

// Adds the metrics read from `stats` (the service's Stats: the shard's, and
// the refusals of the service) to the global exposition, read once per
// scrape, labelled with metrics::ProcessLabels(). What `stats` reads must
// outlive every later scrape (stop the metrics server first).
void ExportShardMetrics(std::function<StatsResponse()> stats);
// The same metrics as a collectable labelled `labels`: each Collect runs
// `stats` once.
std::shared_ptr<const prometheus::Collectable> ShardStatsMetrics(
    prometheus::Labels labels, std::function<StatsResponse()> stats);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_PS_METRICS_H_
