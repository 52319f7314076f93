// A worker's training session with the PS shards: the one place a worker
// decides what to wait for, what to retry and when to give up.
//
// A trainer (worker/training/), or the Python binding, brings the data and
// the model; the session brings everything about the shards:
//   - the versions: each exchange's push is tagged with the versions of the
//     last parameters the worker read, and the next read waits for the
//     versions the consistency policy says follow it
//     (consistency/consistency_policy.h: MinVersionAfterPush);
//   - the heartbeats that keep the worker in every shard's live set, from
//     Join to Finish;
//   - the transient-refusal policy (Redo): a step refused for now (a shard
//     overloaded, restarting, or without the worker's region;
//     TransientRefusalOf) is backed off, the shards rejoined, and the whole
//     step run again on what they then hold, within one budget of
//     training.pull_timeout_seconds for the refusals in a row;
//   - failovers, where the job has backups (cluster.ps_backups): an
//     exchange that finds a shard's primary gone, or a backup where it
//     called, registers again (the client finds each shard's primary) and
//     sends the same exchange again: the same gradients, versions and
//     sequences, so a shard that took the push before answers DUPLICATE
//     and nothing is applied twice, and nothing is recomputed;
//   - the lost-updates check on a rejoin: a shard that came back further
//     behind than a checkpoint interval ends the run (FailedPrecondition);
//   - the worker's metrics (worker/client/worker_metrics.h).
//
// A session is used by one thread at a time (the heartbeats run on their
// own). It borrows its client, which must outlive it.
#ifndef PST_WORKER_SESSION_TRAINING_SESSION_H_
#define PST_WORKER_SESSION_TRAINING_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "config.pb.h"
#include "consistency/consistency_policy.h"
#include "ps.pb.h"
#include "worker/client/row_split.h"
#include "worker/client/step_exchange.h"
#include "worker/session/shard_patience.h"

namespace pst {

class PsClient;

// What one exchange carries (TrainingSession::Exchange). Up: one gradient
// per variable (`gradients`, or none), and row gradients; down: every
// variable's values into `values` (or none), and the rows `pull_rows`
// names. An exchange that pushes and reads is one step's round trip; one
// that only pushes leaves the next read to wait for what the push makes
// due; one that only reads takes what is due.
struct StepRequest {
  const std::vector<std::span<const float>>* gradients = nullptr;
  std::span<const RowGradients> push_rows = {};
  const std::vector<std::span<float>>* values = nullptr;
  std::span<const RowValues> pull_rows = {};
};

class TrainingSession {
 public:
  // A session of worker `rank` of `config`'s job over `client` (borrowed).
  // InvalidArgument for consistency settings no policy takes.
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(const JobConfig& config, int rank,
                                                                 PsClient* client);
  ~TrainingSession();

  PsClient& client() const { return *client_; }
  int rank() const { return rank_; }

  // Registers with every shard, waiting out refusals for now (a shard
  // restarting, this worker's former process still holding its lease)
  // within training.pull_timeout_seconds unless `wait_out_refusals` is
  // false, checks that they run this config's mode and worker count
  // (FailedPrecondition otherwise), and starts the heartbeats. Returns
  // shard 0's answer. Again later, it rejoins: the next read takes
  // whatever the shards hold.
  absl::StatusOr<RegisterResponse> Join(bool wait_out_refusals = true);
  // Whether Join has succeeded (the heartbeats run until Finish).
  bool joined() const { return heartbeats_.joinable(); }

  // Offers the model's initial values to every shard (a shard that holds
  // values keeps them); `initial` gives them, now and again for a shard
  // that comes back without the model. Whether shard 0 took them.
  using InitialValues = std::function<std::vector<std::vector<float>>()>;
  absl::StatusOr<bool> Init(InitialValues initial);
  // The same, offering `values` now (one span per variable).
  absl::StatusOr<bool> Init(const std::vector<std::span<const float>>& values,
                            InitialValues again);

  // One exchange with every shard (StepRequest), at the versions the
  // consistency policy requires. Fails as the client fails; Redo decides
  // what a failure means for the step.
  absl::Status Exchange(const StepRequest& request);

  // The layer-wise exchange (PsClient::BeginExchange): gradients pushed in
  // `push_order` as backward makes them final, values back into `values`.
  // FinishExchange takes its versions and answers, as Exchange does.
  absl::StatusOr<std::unique_ptr<StepExchange>> BeginExchange(
      const std::vector<std::span<const float>>& gradients, const std::vector<int>& push_order,
      const std::vector<std::span<float>>& values);
  absl::Status FinishExchange(std::unique_ptr<StepExchange> exchange);

  // Whether the last exchange left every variable's current values in the
  // caller's buffers (no read needed before the next step's compute).
  bool parameters_current() const { return parameters_current_; }

  // Runs `step` (a whole step: read if needed, compute, exchange) until it
  // ends in anything but a refusal for now; after each such refusal backs
  // off, rejoins the shards and runs it again, within one budget of
  // training.pull_timeout_seconds for the refusals in a row. Unavailable
  // once that is spent (a launcher restarts the worker); a rejoin that
  // finds updates lost ends the run (FailedPrecondition).
  absl::Status Redo(absl::FunctionRef<absl::Status()> step);

  // A step of `examples` examples, begun at `start`, is done (an
  // InfinitePast start: counted, not timed).
  void CountStep(absl::Time start, int examples);
  // The staleness of this session's pushes at shard 0 since the last call.
  int64_t TakeStaleness();
  // Steps run again after a refusal for now.
  int64_t redone_steps() const { return redone_steps_; }
  // Exchanges sent again after a failover.
  int64_t resent_exchanges() const { return resent_exchanges_; }

  // Each shard's version at the last read.
  const std::vector<int64_t>& versions() const { return versions_; }
  // What the shards said of the last push.
  const std::vector<PushResponse>& last_responses() const { return responses_; }

  // Tells every shard this worker has finished, and stops the heartbeats.
  absl::Status Finish();
  // The chief's wait for every worker to finish (shard_patience.h).
  absl::StatusOr<WorkersAtEnd> AwaitWorkersDone();

 private:
  TrainingSession(const JobConfig& config, int rank, PsClient* client,
                  std::unique_ptr<const ConsistencyPolicy> policy);
  absl::Duration patience() const;
  // The versions each shard must reach after a push computed at `computed_at`.
  std::vector<int64_t> MinVersionsAfter(const std::vector<int64_t>& computed_at) const;
  // Runs `exchange` (the same one each time) until it ends in anything but
  // a shard's failover (Exchange, above), within one budget of patience.
  // A shard that came back behind what this worker read (no replica held
  // its state) ends it with the exchange's error: Redo runs the step again.
  absl::Status FollowingFailovers(absl::FunctionRef<absl::Status()> exchange);
  // The same, after a first try that ended in `status`.
  absl::Status SendAgainAfterFailovers(absl::Status status,
                                       absl::FunctionRef<absl::Status()> exchange);
  // Whether the job's shards have backups to fail over to.
  bool follows_failovers() const;
  // After a read at versions_: metrics, and what the next read waits for.
  void TookValues(absl::Time start);
  // After a push computed at `computed_at`, begun at `start`.
  void Pushed(const std::vector<int64_t>& computed_at, absl::Time start);
  // After `cause` (a refusal for now): registers again with `retry`'s
  // backoff, checks that no acknowledged update is lost, offers the
  // initial values to a shard that came back without the model.
  absl::Status Rejoin(const absl::Status& cause, Retry* retry);
  void StartHeartbeats();
  void StopHeartbeats();

  const JobConfig& config_;
  const int rank_;
  PsClient* const client_;
  const std::unique_ptr<const ConsistencyPolicy> policy_;
  InitialValues initial_;
  std::vector<int64_t> versions_;   // each shard's version at the last read
  std::vector<int64_t> next_min_;   // what the next read waits for
  std::vector<PushResponse> responses_;
  bool parameters_current_ = false;
  // The layer-wise exchange in flight: what it pushed at, and since when.
  std::vector<int64_t> exchange_computed_at_;
  std::vector<std::span<const float>> exchange_gradients_;
  std::vector<std::span<float>> exchange_values_;
  absl::Time exchange_start_;
  int64_t staleness_ = 0;
  int64_t redone_steps_ = 0;
  int64_t resent_exchanges_ = 0;
  std::unique_ptr<absl::Notification> stop_heartbeats_;
  std::thread heartbeats_;
};

}  // namespace pst

#endif  // PST_WORKER_SESSION_TRAINING_SESSION_H_
