#include "ps_server/core/shard_options.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ps_server/core/model_share.h"

namespace pst {

ShardOptions ShardOptionsFromConfig(const JobConfig& config, int shard) {
  const TrainingConfig& training = config.training();
  ShardOptions options;
  static_cast<ConsistencyOptions&>(options) = ConsistencyOptionsFromConfig(config);
  if (training.lease_seconds() > 0) {
    options.lease = absl::Seconds(static_cast<double>(training.lease_seconds()));
  }
  options.shard = shard;
  options.num_shards = config.cluster().ps_size();
  if (shard < config.cluster().ps_backups_size()) {
    options.replicas = 1 + config.cluster().ps_backups(shard).address_size();
  }
  options.elected = options.replicas > 1 && !config.cluster().membership().etcd_endpoints().empty();
  options.optimizer = training.optimizer();
  options.seed = training.seed();
  options.model = ConfigModelOf(config);
  if (!training.checkpoint().dir().empty()) {
    options.snapshot_every_steps = training.checkpoint().every_steps();
    options.checkpoint_full_every = training.checkpoint().full_every();
  }
  return options;
}

absl::Duration MembershipLease(const JobConfig& config) {
  const Membership& membership = config.cluster().membership();
  if (membership.has_lease_seconds()) return absl::Seconds(std::max(1, membership.lease_seconds()));
  const absl::Duration lease = ShardOptionsFromConfig(config, 0).lease;
  return std::max(absl::Seconds(1), absl::Ceil(lease, absl::Seconds(1)));
}

absl::Status CheckShardOptions(const ShardOptions& options) {
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError("a parameter server needs at least one worker");
  }
  if (options.model && (options.shard < 0 || options.shard >= options.num_shards)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options.shard, " is not one of the ", options.num_shards, " shards"));
  }
  return absl::OkStatus();
}

}  // namespace pst
