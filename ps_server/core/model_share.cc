#include "ps_server/core/model_share.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/ctr_config.h"
#include "common/embedding_config.h"
#include "google/protobuf/util/message_differencer.h"
#include "placement/placement.h"

namespace pst {
namespace {

std::string Describe(absl::string_view name, const std::vector<int64_t>& shape) {
  return absl::StrCat("\"", name, "\" [", absl::StrJoin(shape, ", "), "]");
}

std::string Describe(const EmbeddingTableConfig& table) {
  return absl::StrCat("\"", table.name(), "\" of dim ", table.dim());
}

// An MLP of the given layer widths, as worker/model/mlp.h declares it.
std::vector<VariableSpec> MlpVariables(const std::vector<int64_t>& widths, bool bias) {
  std::vector<VariableSpec> variables;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    variables.push_back({absl::StrCat("dense_", l, "/kernel"), {widths[l], widths[l + 1]}});
    if (bias) variables.push_back({absl::StrCat("dense_", l, "/bias"), {widths[l + 1]}});
  }
  return variables;
}

// The first setting of two tables of the same name and dim that differs,
// or empty.
std::string OtherSetting(const EmbeddingTableConfig& given, const EmbeddingTableConfig& wanted) {
  if (!google::protobuf::util::MessageDifferencer::Equals(given.optimizer(), wanted.optimizer())) {
    return "another optimizer";
  }
  if (given.max_rows_per_shard() != wanted.max_rows_per_shard()) {
    return absl::StrCat("max_rows_per_shard ", given.max_rows_per_shard(), " where the config has ",
                        wanted.max_rows_per_shard());
  }
  if (given.init_scale() != wanted.init_scale()) {
    return absl::StrCat("init_scale ", given.init_scale(), " where the config has ",
                        wanted.init_scale());
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(given, wanted)) {
    return "other settings";
  }
  return "";
}

}  // namespace

std::optional<ConfigModel> ConfigModelOf(const JobConfig& config) {
  const TrainingConfig& training = config.training();
  if (!config.cluster().worker_command().empty()) return std::nullopt;
  ConfigModel model;
  model.job_optimizer = training.optimizer();
  if (training.model().has_mlp()) {
    const MlpConfig& mlp = training.model().mlp();
    const auto [inputs, outputs] = ModelEnds(training.dataset());
    std::vector<int64_t> widths = {inputs};
    widths.insert(widths.end(), mlp.hidden().begin(), mlp.hidden().end());
    widths.push_back(outputs);
    model.variables = MlpVariables(widths, !mlp.no_bias());
    return model;
  }
  if (!training.model().has_ctr()) return std::nullopt;
  // A config that loaded resolves; one that does not names no model a
  // shard could check against.
  absl::StatusOr<CtrTables> tables = CtrShardTables(training);
  if (!tables.ok()) return std::nullopt;
  const CtrModelConfig& ctr = training.model().ctr();
  const CtrShape shape = CtrShapeOf(training.dataset().ctr());
  int64_t dim = 0;
  for (const EmbeddingTableConfig& table : training.model().embeddings()) {
    if (table.name() == ctr.table()) dim = table.dim();
  }
  std::vector<int64_t> widths = {int64_t{shape.fields} * dim + shape.dense};
  widths.insert(widths.end(), ctr.hidden().begin(), ctr.hidden().end());
  widths.push_back(1);
  model.variables = MlpVariables(widths, /*bias=*/true);
  model.embeddings = std::move(tables->tables);
  return model;
}

std::vector<VariableSpec> ShardShare(const std::vector<VariableSpec>& model, int shard,
                                     int num_shards) {
  std::vector<VariableSpec> share;
  for (const VariableSlice& slice : PlaceModel(model, num_shards)) {
    if (slice.shard == shard) share.push_back({slice.name, slice.shape});
  }
  return share;
}

ConfigModel ShardShare(const ConfigModel& model, int shard, int num_shards) {
  return {ShardShare(model.variables, shard, num_shards), model.embeddings, model.job_optimizer};
}

namespace {

// The first difference between a model of `variables` (name and shape, in
// order) and `tables` and `share`; empty when it is the share.
std::string ShareDifference(const std::vector<VariableSpec>& variables,
                            const google::protobuf::RepeatedPtrField<EmbeddingTableConfig>& specs,
                            const ConfigModel& share) {
  const size_t given = variables.size();
  const size_t wanted = share.variables.size();
  for (size_t i = 0; i < given && i < wanted; ++i) {
    const VariableSpec& have = variables[i];
    const VariableSpec& want = share.variables[i];
    if (have.name != want.name || have.shape != want.shape) {
      return absl::StrCat("variable ", i, " is ", Describe(have.name, have.shape),
                          " where the model has ", Describe(want.name, want.shape));
    }
  }
  if (given != wanted) {
    return absl::StrCat("it carries ", given, " variables, the share is ", wanted);
  }
  absl::StatusOr<std::vector<EmbeddingTableConfig>> tables =
      ResolveEmbeddingTables(specs, share.job_optimizer);
  if (!tables.ok()) return std::string(tables.status().message());
  const size_t tables_wanted = share.embeddings.size();
  for (size_t i = 0; i < tables->size() && i < tables_wanted; ++i) {
    const EmbeddingTableConfig& table = (*tables)[i];
    const EmbeddingTableConfig& want = share.embeddings[i];
    if (table.name() != want.name() || table.dim() != want.dim()) {
      return absl::StrCat("embedding table ", i, " is ", Describe(table), " where the model has ",
                          Describe(want));
    }
    if (std::string other = OtherSetting(table, want); !other.empty()) {
      return absl::StrCat("embedding table \"", table.name(), "\" has ", other);
    }
  }
  if (tables->size() != tables_wanted) {
    return absl::StrCat("it declares ", tables->size(), " embedding tables, the model has ",
                        tables_wanted);
  }
  return "";
}

}  // namespace

absl::Status CheckInitIsShare(const InitRequest& init, const ConfigModel& share, int shard) {
  std::vector<VariableSpec> variables;
  for (const Tensor& variable : init.variables()) {
    variables.push_back({variable.name(), {variable.shape().begin(), variable.shape().end()}});
  }
  if (std::string difference = ShareDifference(variables, init.embeddings(), share);
      !difference.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an Init from worker:", init.worker(), " does not carry shard ", shard,
        "'s share of the config's model (training.model): ", difference,
        "; is that worker running with another config?"));
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointIsShare(const ShardCheckpoint& checkpoint, const ConfigModel& share) {
  std::vector<VariableSpec> variables;
  for (const ShardCheckpoint::Variable& variable : checkpoint.variables()) {
    variables.push_back({variable.name(), {variable.shape().begin(), variable.shape().end()}});
  }
  google::protobuf::RepeatedPtrField<EmbeddingTableConfig> tables;
  for (const ShardCheckpoint::Embedding& table : checkpoint.embeddings()) {
    *tables.Add() = table.config();
  }
  if (std::string difference = ShareDifference(variables, tables, share); !difference.empty()) {
    return absl::InvalidArgumentError(difference);
  }
  return absl::OkStatus();
}

int64_t MaxShareInitBytes(const ConfigModel& share) {
  // Per tensor: its framing, name, dtype and shape (10 bytes a dimension at
  // most) and 4 bytes an element; per table its config and framing; then
  // room for the worker field and settings a worker fills in beyond the
  // config's (a table's resolved optimizer).
  constexpr int64_t kPerTensor = 32, kPerTable = 16, kRest = 64 * 1024;
  int64_t bytes = kRest;
  for (const VariableSpec& v : share.variables) {
    bytes += kPerTensor + static_cast<int64_t>(v.name.size()) +
             10 * static_cast<int64_t>(v.shape.size()) + 4 * v.size();
  }
  for (const EmbeddingTableConfig& table : share.embeddings) {
    bytes += kPerTable + static_cast<int64_t>(table.ByteSizeLong());
  }
  return bytes;
}

}  // namespace pst
