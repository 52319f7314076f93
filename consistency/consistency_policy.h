// The consistency rule of a parameter-server job (SYNC, ASYNC or SSP): when
// a gradient is applied, when a step is complete, when a pull may read.
//
// A policy is pure logic over a read-only view of the shard state it needs,
// passed in on every call; the shard owns that state, its lock and its
// buffers. So the rules are tested without a shard or a network, and the
// worker (which needs the version to wait for after a push) links them
// without the server: this library depends on the protos and Abseil only.
// A policy holds only its options, so it is safe to share between threads.
#ifndef PST_CONSISTENCY_CONSISTENCY_POLICY_H_
#define PST_CONSISTENCY_CONSISTENCY_POLICY_H_

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config.pb.h"

namespace pst {

// What a policy reads of one worker.
struct WorkerProgress {
  int64_t clock = 0;     // valid gradients pushed (dropped ones included)
  bool live = true;      // in the shard's live set
  bool done = false;     // reported Done
  bool pushed = false;   // has a gradient waiting in the current step's aggregate
};

// What a policy reads of a shard: its version and its workers, by rank.
struct ShardView {
  int64_t version = 0;
  std::span<const WorkerProgress> workers;
};

// What becomes of a valid push.
struct Admission {
  enum class Action {
    kApply,      // applied on its own, as the next version
    kAggregate,  // held for the current step (then StepComplete decides)
    kDrop,       // too stale: counted, not applied
  };
  Action action = Action::kApply;
  float lr_scale = 1.0f;  // kApply: the learning rate is multiplied by this
};

class ConsistencyPolicy {
 public:
  virtual ~ConsistencyPolicy() = default;

  // Whether a push must carry a gradient for every variable of the shard
  // (a step averages whole gradients).
  virtual bool PushCarriesEveryVariable() const = 0;

  // What becomes of a valid push from `worker` computed at `computed_at`
  // (0 <= computed_at <= shard.version). FailedPrecondition: the push is
  // refused and must leave no trace but the rejection.
  virtual absl::StatusOr<Admission> AdmitPush(const ShardView& shard, int worker,
                                              int64_t computed_at) const = 0;

  // Whether the aggregated gradients (the workers marked `pushed`) make a
  // step now. Asked after every aggregated push and whenever the live or
  // done set changes; false while nothing is aggregated.
  virtual bool StepComplete(const ShardView& shard) const = 0;

  // Whether a push of `worker` admitted into the current step now would
  // complete it alone: nothing aggregated yet, and StepComplete would hold
  // with `worker` marked `pushed`. A shard applies such a push as it
  // streams in, as it does a push the policy applies on its own.
  virtual bool CompletesStepAlone(const ShardView& shard, int worker) const = 0;

  // Whether a pull of `worker` that wants at least `min_version` may read
  // the (initialized) shard now, or must wait.
  virtual bool PullMayProceed(const ShardView& shard, int worker, int64_t min_version) const = 0;

  // Whether a pull sent with a push computed at `computed_at`, which the
  // shard applies while it streams in, may be answered from the staged
  // values as they are staged: true only if, once the push is committed,
  // PullMayProceed holds whatever the other workers do.
  virtual bool AnswerMayStreamDuringPush(int64_t min_version, int64_t computed_at) const = 0;

  // The version a worker's next pull waits for after it pushed a gradient
  // computed at `computed_at`.
  virtual int64_t MinVersionAfterPush(int64_t computed_at) const = 0;
};

struct ConsistencyOptions {
  Mode mode = SYNC;
  int num_workers = 1;
  int replicas_to_aggregate = 0;  // SYNC; 0 = every live worker
  int staleness = 0;              // SSP bound
  bool staleness_lr_scaling = false;
  int max_staleness = 0;          // ASYNC and SSP; 0 = no bound
};

// The options of the job `config` describes.
ConsistencyOptions ConsistencyOptionsFromConfig(const JobConfig& config);

// The policy of `options.mode`. InvalidArgument for an unknown mode or a
// replicas_to_aggregate outside [0, num_workers].
absl::StatusOr<std::unique_ptr<ConsistencyPolicy>> MakeConsistencyPolicy(
    const ConsistencyOptions& options);

}  // namespace pst

#endif  // PST_CONSISTENCY_CONSISTENCY_POLICY_H_
