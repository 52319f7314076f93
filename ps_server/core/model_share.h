// The share of the config's model a shard is given at Init. When the config
// names the model, a shard takes as its first Init only what that model
// places on it (its dense variables and the model's embedding tables);
// otherwise the first Init wins whatever it carries, so that any process
// able to call the shard first (one holding the cluster token, or any local
// process without auth) could give it a model of its own before the
// workers start.
#ifndef PST_PS_SERVER_CORE_MODEL_SHARE_H_
#define PST_PS_SERVER_CORE_MODEL_SHARE_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "config.pb.h"
#include "placement/variable_spec.h"
#include "ps.pb.h"

namespace pst {

// A model as its workers declare it at Init: the dense variables (or their
// slices) in order, and the embedding tables with their defaults resolved
// (common/embedding_config.h) against the job's optimizer, as a shard
// resolves the tables an Init declares; every shard holds a share of every
// table's rows.
struct ConfigModel {
  std::vector<VariableSpec> variables;
  std::vector<EmbeddingTableConfig> embeddings;
  OptimizerConfig job_optimizer;  // training.optimizer
};

// The model `config` names, as the shipped worker declares it:
//  - training.model.mlp: the MLP over training.dataset's inputs and outputs
//    ("dense_<l>/kernel" [in, out], "dense_<l>/bias" [out]), no tables;
//  - training.model.ctr: the MLP of the CTR model (worker/model/ctr_model.h), of
//    input [fields * dim + dense features] and one output, with biases,
//    and the tables the CTR model keeps on the shards (CtrShardTables,
//    common/ctr_config.h).
// nullopt when the config does not name the model: with
// cluster.worker_command the workers bring their own (a Python script's),
// and a shard then takes the first Init a worker sends.
std::optional<ConfigModel> ConfigModelOf(const JobConfig& config);

// The part of `model` that shard `shard` of `num_shards` holds, as workers
// send it at Init: each variable or slice with its name and shape, in
// order, and every table.
std::vector<VariableSpec> ShardShare(const std::vector<VariableSpec>& model, int shard,
                                     int num_shards);
ConfigModel ShardShare(const ConfigModel& model, int shard, int num_shards);

// The most bytes an InitRequest carrying exactly `share` (its variables in
// float32, and its tables) can take on the wire: an Init larger than this
// cannot be the share, whatever it holds.
int64_t MaxShareInitBytes(const ConfigModel& share);

// InvalidArgument naming the first difference unless `init` carries
// exactly the variables `share` names (names and shapes, in order) and its
// tables (in order, each setting equal once the Init's tables are resolved
// against share.job_optimizer).
absl::Status CheckInitIsShare(const InitRequest& init, const ConfigModel& share, int shard);
// The same for the model a checkpoint holds: InvalidArgument naming the
// first difference from `share`.
absl::Status CheckCheckpointIsShare(const ShardCheckpoint& checkpoint, const ConfigModel& share);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_MODEL_SHARE_H_
