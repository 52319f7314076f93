// psctl plan: how many PS shards a job needs, by the cost model that
// benchmarks/cost_model.py fits to rows measured across shaped links
// (scripts/netns_cluster.sh). The formulas are that module's, term by term:
//
//   worker_link = M / (eta_w B) + fill min(M, K C) / B
//   shard_link  = 2 N f M / (eta_s B)
//   apply       = gamma N f M
//   messages    = alpha + beta K + rtt
//   SYNC:  T = compute + messages + 2 max(M, N f M) / (eta_y B) + fill min(M, K C) / B + apply
//   ASYNC: T = max(compute + messages + worker_link, shard_link + apply)
//
// M: wire bytes one worker sends (and receives) per step; B: bytes/s of a
// port each way; C: the 1 MiB chunk an exchange streams in; f: the busiest
// shard's share of M, from the model's real placement (placement/placement.h)
// with embedding rows spread evenly.
#ifndef PST_PSCTL_PLAN_H_
#define PST_PSCTL_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "placement/variable_spec.h"
#include "config.pb.h"

namespace pst {

struct CostConstants {
  double alpha_s = 0;           // per step
  double beta_s = 0;            // per shard called per step
  double eta_w = 1;             // a port's streamed bytes against one direction's rate
  double fill = 1;              // the last chunk to each shard, which no push overlaps
  double eta_s = 1;             // the busiest shard's in + out under ASYNC, against one direction
  double gamma_s_per_byte = 0;  // a shard's CPU per gradient byte received
  double eta_y = 1;             // SYNC: the busiest port's in + out against one direction
};

// The constants fitted on the namespace cluster (docs/bench/netns_cluster.json,
// row "constants"); tests/psctl/plan_test.cc keeps the two equal.
CostConstants FittedConstants();

struct PlanJob {
  int workers = 1;
  Mode mode = SYNC;
  int batch_size = 1;                 // samples per worker per step
  double dense_wire_bytes = 0;        // the dense model at the wire dtype
  double embedding_wire_bytes = 0;    // rows one step pushes (and pulls), ids included
  double link_bytes_per_s = 0;        // each way
  double rtt_s = 0;
  double compute_s = 0;               // one worker's step without the exchange
};

struct PlanRow {
  int shards = 0;
  double shard_share = 0;  // the busiest shard's part of a step's bytes
  double step_s = 0;
  double samples_per_s = 0;
};

// Seconds per step of one worker with `shards` shards, the busiest holding
// `shard_share` of the bytes.
double StepSeconds(const CostConstants& c, const PlanJob& job, int shards, double shard_share);

// The busiest shard's share of a step's bytes with `shards` shards: the
// dense variables as placed, the embedding rows spread evenly.
double BusiestShardShare(const std::vector<VariableSpec>& dense, double dense_wire_bytes,
                         double embedding_wire_bytes, int shards);

// One row per K = 1..max_shards, leaving out K that would leave a shard
// without a slice of the dense model (placement refuses those).
std::vector<PlanRow> Plan(const CostConstants& c, const PlanJob& job,
                          const std::vector<VariableSpec>& dense, int max_shards);

// The most shards a job's step has bytes to split for: one per worker. With
// K shards the busiest one's port carries about N/K of a worker's M each
// way; from K = N on that is no more than the worker's own port carries,
// so the step's link time stops falling, and what more shards still save
// is the busiest shard's CPU per byte, which the fit has no fixed cost per
// shard (a process, a port, a call per worker per step) to weigh against.
int UsefulShards(const PlanJob& job);

// Among the rows of at most `max_shards` shards, the smallest K whose
// samples/s is within `tolerance` (0.05: 5%) of their best.
const PlanRow& Recommend(const std::vector<PlanRow>& rows, double tolerance,
                         int max_shards = 1 << 30);

// The dense variables of the config's model: the MLP's kernels and biases
// for the config's data set (Fashion-MNIST 784 -> 10 classes, quadratic
// 3 -> 1, parabola 1 -> 1, linear regression features -> 1).
absl::StatusOr<std::vector<VariableSpec>> ModelVariables(const TrainingConfig& training);

// "25gbit" -> 3.125e9 bytes/s; "100us" -> 1e-4 s. InvalidArgument otherwise.
absl::StatusOr<double> ParseLinkBytesPerSecond(const std::string& text);
absl::StatusOr<double> ParseSeconds(const std::string& text);

}  // namespace pst

#endif  // PST_PSCTL_PLAN_H_
