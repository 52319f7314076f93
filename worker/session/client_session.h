// A worker's training session (worker/session/training_session.h) for a
// model its caller computes, one call per step of the loop, safe to call
// from several threads: what the Python module (python/module.cc) drives.
//
// It loads the job config as every binary does and connects the client
// (worker/client/ps_client.h) over the config's channels (TLS, token). The
// TrainingSession under it keeps the versions, the heartbeats and the
// metrics as for the C++ trainers, so a worker driven through it and a C++
// worker are interchangeable in one job. Its transient-refusal policy is
// theirs too: an exchange a shard refuses for now (IsTransientShardError:
// away, restarting, busy, its shared region gone) is backed off, the shards
// rejoined (given this worker's values again where one came back without
// the model) and the exchange redone, pushing the same gradients, within
// training.pull_timeout_seconds; Unavailable once that is spent.
//
// A session may be called from several threads at once. Every call that
// uses the exchange state (the versions, the shared regions, the client's
// buffers) or changes the session holds the session's lock for its whole
// length, so they run one at a time, in the order they take the lock;
// config, worker, num_shards, declared, variables and tensors read what is
// fixed once made, and Stats and AwaitWorkersDone (PsClient says they may
// run beside an exchange) take no lock. A caller that holds another lock
// (Python's GIL) lets go of it before calling, as a call may wait for the
// one in flight.
//
// After Done the session only reads: Pull and PullRows (the chief reads the
// final model once every worker is done), Stats and AwaitWorkersDone; every
// call that would push or change the worker's standing is refused
// (FailedPrecondition).
#ifndef PST_WORKER_SESSION_CLIENT_SESSION_H_
#define PST_WORKER_SESSION_CLIENT_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "config.pb.h"
#include "placement/variable_spec.h"
#include "worker/client/ps_client.h"
#include "worker/session/training_session.h"

namespace pst {

class ClientSession {
 public:
  // Loads `config_path` (empty: the built-in default job) as the worker
  // binary does, the launcher's cluster in the environment included
  // (common/tf_config.h), checks that `task` is one of its workers
  // ("worker:<i>"; empty: TF_CONFIG's or torchrun's task, else worker:RANK,
  // else worker:0), and connects to every shard within `connect_timeout`. InvalidArgument
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
  bool uses_shared_memory(int shard) const ABSL_LOCKS_EXCLUDED(mu_);

  // Registers with every shard, waiting out refusals for now (a shard
  // away or restarting, this worker's former process still holding its
  // lease) within training.pull_timeout_seconds (then Unavailable), checks
  // that they run this config's mode and worker count (FailedPrecondition
  // otherwise), and starts the heartbeats. Returns shard 0's answer (worker_clock: the pushes this
  // worker made before a restart). Again after a transient error
  // (IsTransientShardError), it rejoins: the next pull takes whatever the
  // shards hold.
  absl::StatusOr<RegisterResponse> Register() ABSL_LOCKS_EXCLUDED(mu_);

  // Declares the model's variables, in order (registering first if not
  // yet), and allocates where their values and gradients live
  // (PsClient::AllocateTensors: in a co-located shard's shared region
  // where one is used). Once; FailedPrecondition the second time.
  // InvalidArgument, before anything is allocated, for a dimension below 1
  // or a model of more than kMaxModelParameters (common/config.h) in all.
  absl::Status Declare(std::vector<VariableSpec> variables) ABSL_LOCKS_EXCLUDED(mu_);
  // Once true, variables() and tensors() never change again.
  bool declared() const { return declared_.load(std::memory_order_acquire); }
  // The declared variables (none before Declare).
  const std::vector<VariableSpec>& variables() const;
  // Declare's memory, one span per variable, valid for the session's life.
  // Only once declared().
  const PsClient::Tensors& tensors() const { return *tensors_; }

  // Offers initial values (one span per declared variable); a shard that
  // already holds values keeps them. Whether shard 0 took these.
  absl::StatusOr<bool> Init(const std::vector<std::span<const float>>& values)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Pulls every variable into `out`, waiting for the versions that the last
  // push makes due (nothing before the first push).
  absl::Status Pull(const std::vector<std::span<float>>& out) ABSL_LOCKS_EXCLUDED(mu_);
  // Pushes one gradient per variable, computed on the last pull's values.
  absl::Status Push(const std::vector<std::span<const float>>& gradients)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Push, then Pull, in one exchange per shard. `gradients` and `out` must
  // not overlap.
  absl::Status PushPull(const std::vector<std::span<const float>>& gradients,
                        const std::vector<std::span<float>>& out) ABSL_LOCKS_EXCLUDED(mu_);

  // Embedding tables (worker/session/client_session_rows.cc): the config's
  // training.model.embeddings, then those DeclareTables adds (name, dim;
  // `optimizer`, or the job's when null), before Declare. InvalidArgument
  // for a name used twice, a dim out of range or an optimizer
  // ResolveOptimizerConfig refuses; FailedPrecondition after Declare.
  absl::Status DeclareTables(const std::vector<std::pair<std::string, int>>& tables,
                             const OptimizerConfig* optimizer = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Init, with initial rows of the tables (PsClient::Init).
  absl::StatusOr<bool> InitWithRows(const std::vector<std::span<const float>>& values,
                                    std::span<const RowGradients> rows) ABSL_LOCKS_EXCLUDED(mu_);

  // The dense variables' optimizer, sent with Init (PsClient::SetDenseOptimizer),
  // before Init. InvalidArgument for one ResolveOptimizerConfig refuses.
  absl::Status SetDenseOptimizer(const OptimizerConfig& optimizer) ABSL_LOCKS_EXCLUDED(mu_);
  // The rates every later push carries (PsClient::SetUpdateRates), after
  // Declare; nullopt: the config's.
  absl::Status SetUpdateRates(const std::optional<UpdateRates>& rates) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<EmbeddingTableConfig> tables() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pulls rows into `rows`' spans (no dense variable), at the versions the
  // last push makes due; the session's versions stay the last pull's.
  absl::Status PullRows(std::span<const RowValues> rows) ABSL_LOCKS_EXCLUDED(mu_);
  // Pushes row gradients alone (PsClient::PushRows), computed on the last
  // pull's values.
  absl::Status PushRows(std::span<const RowGradients> rows) ABSL_LOCKS_EXCLUDED(mu_);
  // PushPull, with a step's rows in the same exchanges (PsClient::PushPull).
  absl::Status PushPullRows(const std::vector<std::span<const float>>& gradients,
                            const std::vector<std::span<float>>& out, const StepRows& rows)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tells every shard this worker has finished (again, if called again);
  // stops the heartbeats and ends the session (see above).
  absl::Status Done() ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<StatsResponse> Stats(int shard);
  // Shard 0's Stats once every worker is done or the workers' standing
  // differs from `known_changes` (-1: at once), or after `timeout`.
  absl::StatusOr<StatsResponse> AwaitWorkersDone(int64_t known_changes, absl::Duration timeout);

  // Each shard's version at the last pull.
  std::vector<int64_t> versions() const ABSL_LOCKS_EXCLUDED(mu_);
  // Pushes this session made, and what the shards said of the last one.
  int64_t pushes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Exchanges redone after a refusal for now.
  int64_t redone_steps() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<PushResponse> last_responses() const ABSL_LOCKS_EXCLUDED(mu_);
  // The staleness of this session's pushes at shard 0, summed.
  int64_t staleness_total() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ClientSession(JobConfig config, std::unique_ptr<PsClient> client);
  absl::StatusOr<RegisterResponse> RegisterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckDeclared(size_t spans) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition naming `call` once Done has ended the session.
  absl::Status CheckNotEnded(const char* call) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A push of this session's, exchanged by `request`: counted, with the
  // step's time since the last one ended (the caller's compute).
  absl::Status PushStep(const StepRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobConfig config_;
  // Whose data path (its regions, buffers and calls in flight) mu_ guards
  // for every call but Stats, AwaitWorkersDone and the heartbeats' Heartbeat.
  const std::unique_ptr<PsClient> client_;
  // Held by every call that uses the exchange state, for its whole length.
  mutable absl::Mutex mu_;
  // The versions, heartbeats and metrics, over client_.
  std::unique_ptr<TrainingSession> session_ ABSL_GUARDED_BY(mu_);
  // Written once, by Declare under mu_, before declared_ becomes true;
  // read without the lock after that.
  std::vector<VariableSpec> variables_;
  std::optional<PsClient::Tensors> tensors_;
  std::atomic<bool> declared_ = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // by Done
  int64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t staleness_total_ ABSL_GUARDED_BY(mu_) = 0;
  // Of the last pull or push.
  absl::Time last_step_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pst

#endif  // PST_WORKER_SESSION_CLIENT_SESSION_H_
