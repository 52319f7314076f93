// What a shard is built with (parameter_shard.h), and what a caller of
// its push has already checked.
#ifndef PST_PS_SERVER_CORE_SHARD_OPTIONS_H_
#define PST_PS_SERVER_CORE_SHARD_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "config.pb.h"
#include "placement/variable_spec.h"
#include "consistency/consistency_policy.h"
#include "ps_server/core/lease_tracker.h"
#include "ps_server/core/model_share.h"

namespace pst {

// The consistency options (mode, workers, ...) are the policy's.
struct ShardOptions : ConsistencyOptions {
  absl::Duration lease = absl::Seconds(5);
  // The time leases run on; null: the system's. Must outlive the shard.
  const LeaseClock* lease_clock = nullptr;
  // A push streaming into the update (StreamedUpdate) that receives nothing
  // for this long while another update waits for it is cancelled, so that a
  // worker that stalls mid-stream (paused, cut off without a reset) holds
  // the others up for this long, not for its call's whole deadline.
  absl::Duration stalled_stream_timeout = absl::Seconds(5);
  // Copy the state each time the version reaches a multiple of this, for a
  // checkpoint that lands exactly there (0 = never).
  int64_t snapshot_every_steps = 0;
  // CheckpointConfig.full_every: every Nth checkpoint capture is full, the
  // others deltas of a chain (0 or 1: every one full).
  int64_t checkpoint_full_every = 0;
  int shard = 0;
  int num_shards = 1;
  // The processes that hold this shard (its primary and its backups:
  // parameter_shard.h, "Replicas"), and this one's place among them.
  int replicas = 1;
  int replica = 0;
  // Whether the primary is elected (a membership: ps_server/service/shard_office.h):
  // then no replica starts as primary. Otherwise replica 0 is primary for good.
  bool elected = false;
  OptimizerConfig optimizer;
  // training.seed: the embedding rows' initial values.
  uint64_t seed = 0;
  // The model the config names (ps_server/core/model_share.h): a first Init
  // carrying anything but this shard's share of it is refused. Unset when
  // the workers bring their own model: the first Init wins.
  std::optional<ConfigModel> model;
};

// The options of shard `shard` of the job `config` describes.
ShardOptions ShardOptionsFromConfig(const JobConfig& config, int shard);
// A primary's lease in the membership (Membership.lease_seconds, else the
// workers' lease), in whole seconds, at least one.
absl::Duration MembershipLease(const JobConfig& config);
// InvalidArgument for fewer than one worker, or a shard outside the job
// whose model it must check Init against.
absl::Status CheckShardOptions(const ShardOptions& options);

// What a caller of ParameterShard::Push has already established about a
// push, so that Push does not check it again: a pass over a large payload
// costs about as much as applying it.
struct PushChecked {
  bool values_finite = false;  // every dense gradient value is finite
  bool rows_finite = false;    // every embedding row gradient value is finite
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SHARD_OPTIONS_H_
