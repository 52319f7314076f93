// A worker's session with the PS shards, as the Python module drives it:
// the steps of the C++ trainer's loop (worker/training/trainer.h) that talk to the
// shards, for a model the caller computes.
//
// The session loads the job config as every binary does, connects the
// client (worker/client/ps_client.h) over the config's channels (TLS, token) and
// sets the wire dtype and the transport (shared memory or TCP) the config
// names. It keeps the versions the consistency policy needs: a push is
// tagged with the versions of the last pull, and the next pull waits for
// the versions the policy says follow it (consistency/consistency_policy.h),
// so a worker driven through it and a C++ worker are interchangeable in
// one job. Once registered, it keeps the worker in every shard's live set
// with heartbeats (every lease_seconds / 4) while the caller computes.
//
// Pull, Push and PushPull may not run concurrently with each other; the
// other calls may. They record the worker's metrics (worker/
// worker_metrics.h) as the C++ trainer does: latencies, steps, versions,
// staleness and drops per shard.
#ifndef PST_PYTHON_CLIENT_SESSION_H_
#define PST_PYTHON_CLIENT_SESSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "config.pb.h"
#include "placement/variable_spec.h"
#include "consistency/consistency_policy.h"
#include "worker/client/ps_client.h"

namespace pst {

class ClientSession {
 public:
  // Loads `config_path` (empty: the built-in default job) as the worker
  // binary does, checks that `task` is one of its workers ("worker:<i>"),
  // and connects to every shard within `connect_timeout`. InvalidArgument
  // or NotFound for a bad config or task, Unavailable for a shard that
  // cannot be reached.
  static absl::StatusOr<std::unique_ptr<ClientSession>> Open(const std::string& config_path,
                                                             const std::string& task,
                                                             absl::Duration connect_timeout);
  ~ClientSession();

  const JobConfig& config() const { return config_; }
  int worker() const { return client_->worker(); }
  int num_shards() const { return client_->num_shards(); }
  // Whether shard s's tensors travel through shared memory (known after
  // Declare).
  bool uses_shared_memory(int shard) const { return client_->uses_shared_memory(shard); }

  // Registers with every shard, checks that they run this config's mode
  // and worker count (FailedPrecondition otherwise), and starts the
  // heartbeats. Returns shard 0's answer (worker_clock: the pushes this
  // worker made before a restart). Again after a transient error
  // (IsTransientShardError), it rejoins: the next pull takes whatever the
  // shards hold.
  absl::StatusOr<RegisterResponse> Register();

  // Declares the model's variables, in order (registering first if not
  // yet), and allocates where their values and gradients live
  // (PsClient::AllocateTensors: in a co-located shard's shared region
  // where one is used). Once; FailedPrecondition the second time.
  absl::Status Declare(std::vector<VariableSpec> variables);
  bool declared() const { return tensors_.has_value(); }
  const std::vector<VariableSpec>& variables() const { return variables_; }
  // Declare's memory, one span per variable, valid for the session's life.
  const PsClient::Tensors& tensors() const { return *tensors_; }

  // Offers initial values (one span per declared variable); a shard that
  // already holds values keeps them. Whether shard 0 took these.
  absl::StatusOr<bool> Init(const std::vector<std::span<const float>>& values);

  // Pulls every variable into `out`, waiting for the versions that the last
  // push makes due (nothing before the first push).
  absl::Status Pull(const std::vector<std::span<float>>& out);
  // Pushes one gradient per variable, computed on the last pull's values.
  absl::Status Push(const std::vector<std::span<const float>>& gradients);
  // Push, then Pull, in one exchange per shard. `gradients` and `out` must
  // not overlap.
  absl::Status PushPull(const std::vector<std::span<const float>>& gradients,
                        const std::vector<std::span<float>>& out);

  // Embedding tables (python/client_session_rows.cc): the config's
  // training.model.embeddings, then those DeclareTables adds (name, dim;
  // the job's optimizer), before Declare. InvalidArgument for a name used
  // twice or a dim out of range; FailedPrecondition after Declare.
  absl::Status DeclareTables(const std::vector<std::pair<std::string, int>>& tables);
  const std::vector<EmbeddingTableConfig>& tables() const { return client_->embedding_tables(); }
  // Pulls rows into `rows`' spans (no dense variable), at the versions the
  // last push makes due; the session's versions stay the last pull's.
  absl::Status PullRows(std::span<const RowValues> rows);
  // Pushes row gradients alone (PsClient::PushRows), computed on the last
  // pull's values.
  absl::Status PushRows(std::span<const RowGradients> rows);
  // PushPull, with a step's rows in the same exchanges (PsClient::PushPull).
  absl::Status PushPullRows(const std::vector<std::span<const float>>& gradients,
                            const std::vector<std::span<float>>& out, const StepRows& rows);

  // Tells every shard this worker has finished; stops the heartbeats.
  absl::Status Done();

  absl::StatusOr<StatsResponse> Stats(int shard);
  // Shard 0's Stats once every worker is done or the workers' standing
  // differs from `known_changes` (-1: at once), or after `timeout`.
  absl::StatusOr<StatsResponse> AwaitWorkersDone(int64_t known_changes, absl::Duration timeout);

  // Each shard's version at the last pull.
  const std::vector<int64_t>& versions() const { return versions_; }
  // Pushes this session made, and what the shards said of the last one.
  int64_t pushes() const { return pushes_; }
  const std::vector<PushResponse>& last_responses() const { return responses_; }
  // The staleness of this session's pushes at shard 0, summed.
  int64_t staleness_total() const { return staleness_total_; }

 private:
  ClientSession(JobConfig config, std::unique_ptr<PsClient> client,
                std::unique_ptr<const ConsistencyPolicy> policy);
  absl::Duration pull_timeout() const;
  std::vector<int64_t> MinVersionsAfter(const std::vector<int64_t>& computed_at) const;
  absl::Status CheckDeclared(size_t spans) const;
  void StartHeartbeats();
  void StopHeartbeats();
  // The worker metrics of a push made at `computed_at` that began at `push_start`.
  void RecordStep(const std::vector<int64_t>& computed_at, absl::Time push_start);

  const JobConfig config_;
  std::unique_ptr<PsClient> client_;
  std::unique_ptr<const ConsistencyPolicy> policy_;
  std::vector<VariableSpec> variables_;
  std::optional<PsClient::Tensors> tensors_;
  std::vector<int64_t> versions_;  // each shard's version at the last pull
  std::vector<int64_t> next_min_;  // what the next pull waits for
  std::vector<PushResponse> responses_;
  int64_t pushes_ = 0;
  int64_t staleness_total_ = 0;
  absl::Time last_step_end_ = absl::InfinitePast();  // of the last pull or push
  std::unique_ptr<absl::Notification> stop_heartbeats_;
  std::thread heartbeats_;
};

}  // namespace pst

#endif  // PST_PYTHON_CLIENT_SESSION_H_
