#include "consistency/consistency_policy.h"

#include "absl/strings/str_cat.h"
#include "consistency/async_policy.h"
#include "consistency/ssp_policy.h"
#include "consistency/sync_policy.h"

namespace pst {

ConsistencyOptions ConsistencyOptionsFromConfig(const JobConfig& config) {
  const TrainingConfig& training = config.training();
  return {.mode = training.mode(),
          .num_workers = config.cluster().workers(),
          .replicas_to_aggregate = training.replicas_to_aggregate(),
          .staleness = training.staleness(),
          .staleness_lr_scaling = training.staleness_lr_scaling(),
          .max_staleness = training.max_staleness()};
}

absl::StatusOr<std::unique_ptr<ConsistencyPolicy>> MakeConsistencyPolicy(
    const ConsistencyOptions& options) {
  std::unique_ptr<ConsistencyPolicy> policy;
  switch (options.mode) {
    case SYNC:
      policy = std::make_unique<SyncPolicy>(options.replicas_to_aggregate);
      break;
    case ASYNC:
      policy = std::make_unique<AsyncPolicy>(options.staleness_lr_scaling, options.max_staleness);
      break;
    case SSP:
      policy = std::make_unique<SspPolicy>(options.staleness, options.staleness_lr_scaling,
                                           options.max_staleness);
      break;
    default:
      return absl::InvalidArgumentError("the parameter server mode must be SYNC, ASYNC or SSP");
  }
  if (options.replicas_to_aggregate < 0 || options.replicas_to_aggregate > options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas_to_aggregate must be between 1 and the ", options.num_workers,
                     " workers (0 = all)"));
  }
  return policy;
}

}  // namespace pst
