#include "psctl/plan.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ctr_config.h"
#include "common/tensor_stream.h"
#include "placement/placement.h"

namespace pst {

CostConstants FittedConstants() {
  // docs/bench/netns_cluster.json, "constants" row.
  return CostConstants{.alpha_s = 0.0,
                       .beta_s = 0.0,
                       .eta_w = 0.7962624005160481,
                       .fill = 0.42596454835439995,
                       .eta_s = 1.4446578536244514,
                       .gamma_s_per_byte = 8.616852209509192e-10,
                       .eta_y = 1.226373903069992};
}

double StepSeconds(const CostConstants& c, const PlanJob& job, int shards, double shard_share) {
  const double m = job.dense_wire_bytes + job.embedding_wire_bytes;
  const double b = job.link_bytes_per_s;
  const double busiest = job.workers * shard_share * m;  // bytes each way at the busiest shard
  const double messages = c.alpha_s + c.beta_s * shards + job.rtt_s;
  const double fill = c.fill * std::min(m, shards * static_cast<double>(kChunkBytes)) / b;
  const double apply = c.gamma_s_per_byte * busiest;
  if (job.mode == SYNC) {
    return job.compute_s + messages + 2 * std::max(m, busiest) / (c.eta_y * b) + fill + apply;
  }
  const double worker_path = job.compute_s + messages + m / (c.eta_w * b) + fill;
  const double shard_path = 2 * busiest / (c.eta_s * b) + apply;
  return std::max(worker_path, shard_path);
}

double BusiestShardShare(const std::vector<VariableSpec>& dense, double dense_wire_bytes,
                         double embedding_wire_bytes, int shards) {
  std::vector<double> elements(shards, 0);
  double total_elements = 0;
  for (const VariableSlice& s : PlaceModel(dense, shards)) {
    elements[s.shard] += static_cast<double>(s.count);
    total_elements += static_cast<double>(s.count);
  }
  const double total = dense_wire_bytes + embedding_wire_bytes;
  if (total <= 0) return 1.0 / shards;
  double busiest = 0;
  for (int k = 0; k < shards; ++k) {
    const double dense_part =
        total_elements > 0 ? dense_wire_bytes * elements[k] / total_elements : 0;
    busiest = std::max(busiest, dense_part + embedding_wire_bytes / shards);
  }
  return busiest / total;
}

std::vector<PlanRow> Plan(const CostConstants& c, const PlanJob& job,
                          const std::vector<VariableSpec>& dense, int max_shards) {
  std::vector<PlanRow> rows;
  for (int k = 1; k <= max_shards; ++k) {
    if (!dense.empty() && !CheckEveryShardHoldsASlice(PlaceModel(dense, k), k).ok()) continue;
    PlanRow row;
    row.shards = k;
    row.shard_share =
        BusiestShardShare(dense, job.dense_wire_bytes, job.embedding_wire_bytes, k);
    row.step_s = StepSeconds(c, job, k, row.shard_share);
    row.samples_per_s = job.workers * job.batch_size / row.step_s;
    rows.push_back(row);
  }
  return rows;
}

int UsefulShards(const PlanJob& job) { return std::max(1, job.workers); }

const PlanRow& Recommend(const std::vector<PlanRow>& rows, double tolerance, int max_shards) {
  double best = 0;
  for (const PlanRow& r : rows) {
    if (r.shards <= max_shards) best = std::max(best, r.samples_per_s);
  }
  for (const PlanRow& r : rows) {
    if (r.shards <= max_shards && r.samples_per_s >= (1 - tolerance) * best) return r;
  }
  return rows.front();
}

absl::StatusOr<std::vector<VariableSpec>> ModelVariables(const TrainingConfig& training) {
  int inputs = 0, outputs = 0;
  const DatasetConfig& data = training.dataset();
  switch (data.kind_case()) {
    case DatasetConfig::kFashionMnist:
      inputs = 784;
      outputs = 10;
      break;
    case DatasetConfig::kQuadratic:
      inputs = 3;
      outputs = 1;
      break;
    case DatasetConfig::kParabola:
      inputs = 1;
      outputs = 1;
      break;
    case DatasetConfig::kLinearRegression:
      inputs = data.linear_regression().features();
      outputs = 1;
      break;
    case DatasetConfig::kCtr: {
      // The click model's MLP over the pooled rows and the dense features,
      // to one logit; its tables' rows are counted per batch, not here.
      const CtrShape shape = CtrShapeOf(data.ctr());
      int dim = 0;
      for (const EmbeddingTableConfig& table : training.model().embeddings()) {
        if (table.name() == training.model().ctr().table()) dim = table.dim();
      }
      std::vector<VariableSpec> variables;
      int in = shape.fields * dim + shape.dense;
      const auto& hidden = training.model().ctr().hidden();
      for (int l = 0; l <= hidden.size(); ++l) {
        const int out = l < hidden.size() ? hidden[l] : 1;
        variables.push_back({absl::StrCat("dense_", l, "/kernel"), {in, out}});
        variables.push_back({absl::StrCat("dense_", l, "/bias"), {out}});
        in = out;
      }
      return variables;
    }
    case DatasetConfig::KIND_NOT_SET:
      if (training.model().embeddings().empty()) {
        return absl::InvalidArgumentError(
            "the config names no data set, so its model's size is unknown");
      }
      return std::vector<VariableSpec>{};  // a model of embedding tables alone
  }
  if (inputs < 1) {
    return absl::InvalidArgumentError("the data set has no features, so the model has no inputs");
  }
  std::vector<VariableSpec> variables;
  const MlpConfig& mlp = training.model().mlp();
  int in = inputs;
  for (int l = 0; l <= mlp.hidden_size(); ++l) {
    const int out = l < mlp.hidden_size() ? mlp.hidden(l) : outputs;
    variables.push_back({absl::StrCat("dense_", l, "/kernel"), {in, out}});
    if (!mlp.no_bias()) variables.push_back({absl::StrCat("dense_", l, "/bias"), {out}});
    in = out;
  }
  return variables;
}

namespace {

// A number and a unit from `units` (name, scale); "what" names the flag.
absl::StatusOr<double> ParseWithUnit(const std::string& text, const char* what,
                                     std::initializer_list<std::pair<const char*, double>> units,
                                     const char* example) {
  for (const auto& [name, scale] : units) {
    const std::string suffix = name;
    if (text.size() > suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(),
                                                    suffix) == 0) {
      double value = 0;
      if (absl::SimpleAtod(text.substr(0, text.size() - suffix.size()), &value) && value >= 0) {
        return value * scale;
      }
      break;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, "=", text, ": give a number and a unit, e.g. ", example));
}

}  // namespace

absl::StatusOr<double> ParseLinkBytesPerSecond(const std::string& text) {
  absl::StatusOr<double> bytes = ParseWithUnit(
      text, "--link", {{"kbit", 1e3 / 8}, {"mbit", 1e6 / 8}, {"gbit", 1e9 / 8}, {"tbit", 1e12 / 8}},
      "25gbit or 200mbit");
  if (bytes.ok() && *bytes <= 0) return absl::InvalidArgumentError("--link: give a rate above 0");
  return bytes;
}

absl::StatusOr<double> ParseSeconds(const std::string& text) {
  // Longest suffixes first: "us" and "ms" end in "s".
  return ParseWithUnit(text, "--rtt", {{"us", 1e-6}, {"ms", 1e-3}, {"s", 1.0}}, "100us or 1ms");
}

}  // namespace pst
