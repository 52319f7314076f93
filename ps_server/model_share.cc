#include "ps_server/model_share.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "placement/placement.h"

namespace pst {
namespace {

std::string Describe(absl::string_view name, const std::vector<int64_t>& shape) {
  return absl::StrCat("\"", name, "\" [", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

std::optional<std::vector<VariableSpec>> ConfigModelVariables(const JobConfig& config) {
  const TrainingConfig& training = config.training();
  if (!config.cluster().worker_command().empty() || !training.model().has_mlp()) {
    return std::nullopt;
  }
  const MlpConfig& mlp = training.model().mlp();
  const auto [inputs, outputs] = ModelEnds(training.dataset());
  std::vector<int64_t> widths = {inputs};
  widths.insert(widths.end(), mlp.hidden().begin(), mlp.hidden().end());
  widths.push_back(outputs);
  std::vector<VariableSpec> variables;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    variables.push_back({absl::StrCat("dense_", l, "/kernel"), {widths[l], widths[l + 1]}});
    if (!mlp.no_bias()) variables.push_back({absl::StrCat("dense_", l, "/bias"), {widths[l + 1]}});
  }
  return variables;
}

std::vector<VariableSpec> ShardShare(const std::vector<VariableSpec>& model, int shard,
                                     int num_shards) {
  std::vector<VariableSpec> share;
  for (const VariableSlice& slice : PlaceModel(model, num_shards)) {
    if (slice.shard == shard) share.push_back({slice.name, slice.shape});
  }
  return share;
}

absl::Status CheckInitIsShare(const InitRequest& init, const std::vector<VariableSpec>& share,
                              int shard) {
  auto refuse = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an Init from worker:", init.worker(), " does not carry shard ", shard,
        "'s share of the config's model (training.model): ", what,
        "; is that worker running with another config?"));
  };
  const int given = init.variables_size();
  for (int i = 0; i < given && i < static_cast<int>(share.size()); ++i) {
    const Tensor& variable = init.variables(i);
    const std::vector<int64_t> shape(variable.shape().begin(), variable.shape().end());
    if (variable.name() != share[i].name || shape != share[i].shape) {
      return refuse(absl::StrCat("variable ", i, " is ", Describe(variable.name(), shape),
                                 " where the model has ", Describe(share[i].name, share[i].shape)));
    }
  }
  if (given != static_cast<int>(share.size())) {
    return refuse(absl::StrCat("it carries ", given, " variables, the share is ", share.size()));
  }
  return absl::OkStatus();
}

int64_t MaxShareInitBytes(const std::vector<VariableSpec>& share) {
  // Per tensor: its framing, name, dtype and shape (10 bytes a dimension at
  // most) and 4 bytes an element; then room for the worker field and the
  // embedding tables' configs (a name, a dim and an optimizer each).
  constexpr int64_t kPerTensor = 32, kRest = 64 * 1024;
  int64_t bytes = kRest;
  for (const VariableSpec& v : share) {
    bytes += kPerTensor + static_cast<int64_t>(v.name.size()) +
             10 * static_cast<int64_t>(v.shape.size()) + 4 * v.size();
  }
  return bytes;
}

}  // namespace pst
