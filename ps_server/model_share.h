// The share of the config's model a shard is given at Init. When the config
// names the model, a shard takes as its first Init only the variables that
// model places on it; otherwise the first Init wins whatever it carries, so
// that any process able to call the shard first (one holding the cluster
// token, or any local process without auth) could give it a model of its
// own before the workers start.
#ifndef PST_PS_SERVER_MODEL_SHARE_H_
#define PST_PS_SERVER_MODEL_SHARE_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "config.pb.h"
#include "placement/variable_spec.h"
#include "ps.pb.h"

namespace pst {

// The variables of the model `config` names, in the order workers declare
// them: the MLP of training.model over training.dataset's inputs and
// outputs ("dense_<l>/kernel" [in, out], "dense_<l>/bias" [out]). nullopt
// when the config does not name the model: with cluster.worker_command the
// workers bring their own (a Python script's), and a shard then takes the
// first Init a worker sends.
std::optional<std::vector<VariableSpec>> ConfigModelVariables(const JobConfig& config);

// The part of `model` that shard `shard` of `num_shards` holds, as workers
// send it at Init: each variable or slice with its name and shape, in order.
std::vector<VariableSpec> ShardShare(const std::vector<VariableSpec>& model, int shard,
                                     int num_shards);

// The most bytes an InitRequest carrying exactly `share` (float32, and a
// few embedding table configs) can take on the wire: an Init larger than
// this cannot be the share, whatever it holds.
int64_t MaxShareInitBytes(const std::vector<VariableSpec>& share);

// InvalidArgument naming the first difference unless `init` carries
// exactly the variables `share` names (names and shapes, in order).
absl::Status CheckInitIsShare(const InitRequest& init, const std::vector<VariableSpec>& share,
                              int shard);

}  // namespace pst

#endif  // PST_PS_SERVER_MODEL_SHARE_H_
