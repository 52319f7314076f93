// One training step's exchange with every PS shard, fed as backward
// produces the gradients and read as the next forward pass needs the
// parameters, so that communication overlaps computation (P3 /
// ByteScheduler's layer-wise priority).
//
// The gradients go out last layer first, as backward produces them; each
// shard answers first layer first, the order the next forward pass wants.
// A variable's new values may be used as soon as AwaitValues returns: on a
// shard that answers once the push is in (SYNC, SSP, an ASYNC pull that
// must wait), as each variable's values arrive; where the answer streams
// during the push (ASYNC), once the shard has committed it.
#ifndef PST_WORKER_CLIENT_STEP_EXCHANGE_H_
#define PST_WORKER_CLIENT_STEP_EXCHANGE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "ps.pb.h"

namespace pst {

class StepExchange {
 public:
  // Cancels an exchange that was not finished and waits for its calls.
  virtual ~StepExchange() = default;

  // The gradients of `variables` are final: sends them to their shards.
  // Variables must come in the push order the exchange was begun with;
  // calls may come from any thread, one at a time.
  virtual absl::Status Push(std::span<const int> variables) = 0;

  // Waits until `variable`'s new values are in the caller's buffer. May be
  // called from several threads at once.
  virtual absl::Status AwaitValues(int variable) = 0;

  // Waits for every shard's answer to end, after every variable was pushed;
  // fills each shard's version and push response.
  virtual absl::Status Finish(std::vector<int64_t>* versions,
                              std::vector<PushResponse>* responses) = 0;
};

}  // namespace pst

#endif  // PST_WORKER_CLIENT_STEP_EXCHANGE_H_
