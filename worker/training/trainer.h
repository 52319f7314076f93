// The training loop of one worker: pull -> forward/backward -> push, over
// its shard of the data, for the configured number of epochs.
//
// The chief (worker:0) also evaluates the model on the test set after every
// epoch and, once every worker has reported Done, on the final parameters.
#ifndef PST_WORKER_TRAINING_TRAINER_H_
#define PST_WORKER_TRAINING_TRAINER_H_

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/thread_pool.h"
#include "config.pb.h"
#include "kernels/kernels.h"
#include "consistency/consistency_policy.h"
#include "result.pb.h"
#include "worker/training/dataset.h"
#include "worker/model/mlp.h"
#include "worker/training/progress.h"
#include "worker/client/ps_client.h"
#include "worker/report/run_recorder.h"
#include "worker/training/shard_patience.h"
#include "worker/client/step_exchange.h"
#include "worker/model/towers.h"

namespace pst {

// The training and evaluation sets a config names. For the synthetic
// problems the test set is a fresh sample from another seed.
struct TrainingData {
  Dataset train;
  Dataset test;
};
absl::StatusOr<TrainingData> LoadTrainingData(const TrainingConfig& training);

// The model a config describes, sized for `data`.
MlpSpec ModelSpecFor(const TrainingConfig& training, const Dataset& data);

class Trainer {
 public:
  // Borrowed pointers must outlive the Trainer. `data.test` is only read by
  // the chief. One tower per backend in `towers` (worker/model/towers.h).
  Trainer(const JobConfig& config, int rank, PsClient* client, std::vector<Kernels*> towers,
          const TrainingData* data);
  Trainer(const JobConfig& config, int rank, PsClient* client, Kernels* kernels,
          const TrainingData* data)
      : Trainer(config, rank, client, std::vector<Kernels*>{kernels}, data) {}

  // Called in every step once the gradients are computed, before they are
  // pushed (layer-wise: before the step's first push), on the training
  // thread; empty = nothing. A caller that makes a straggler on purpose
  // sleeps in it.
  void set_before_push(std::function<void()> hook) { before_push_ = std::move(hook); }

  // Draw a live progress bar when stdout is a terminal (the worker binary);
  // off by default, so that threads sharing a terminal do not fight over it.
  void set_live_progress(bool live) { live_progress_ = live; }

  // The chief writes TensorBoard scalars here (train/loss, train/samples_per_sec,
  // train/staleness, test/loss, test/accuracy); null = none. Borrowed.
  void set_event_writer(EventWriter* events) { events_ = events; }

  // Trains to the end. Unavailable / DeadlineExceeded when a shard stops
  // answering; InvalidArgument when the data set is too small for the batch.
  absl::StatusOr<WorkerResult> Run();

 private:
  absl::Status Setup();
  absl::StatusOr<WorkerResult> Train(WorkerResult result);
  // Runs steps [first_step, steps_per_epoch) of `epoch`.
  absl::Status RunEpoch(int epoch, int64_t first_step, WorkerResult* result);
  absl::Status PullParameters(const std::vector<int64_t>& min_versions);
  // Forward/backward on batch `step` of `epoch` (after a pull, unless the
  // last step's exchange brought the parameters back), then the exchange:
  // push the gradient, receive the next parameters.
  absl::StatusOr<LossResult> RunStep(int epoch, int64_t step, std::vector<PushResponse>* responses);
  // RunStep with the exchange overlapped with computation (LAYERWISE): the
  // forward pass takes each layer's parameters as they arrive from the last
  // step's exchange, and backward pushes each layer's gradient as soon as
  // it is final. The step's exchange is still in flight when this returns.
  absl::StatusOr<LossResult> RunStepLayerwise(int epoch, int64_t step,
                                              std::vector<PushResponse>* responses);
  // The versions each shard must reach for a push computed at `computed_at`.
  std::vector<int64_t> MinVersionsAfter(const std::vector<int64_t>& computed_at) const;
  // Ends the exchange in flight, if any: its versions and responses are
  // taken, and its values are the parameters (uploaded to every tower if
  // `upload`; the layer-wise forward pass uploads them layer by layer).
  absl::Status FinishExchange(std::vector<PushResponse>* responses, bool upload);
  // Records a step of `batch` examples begun at `start`.
  void RecordStep(absl::Time start, int batch);
  // Records what a finished exchange of a push computed at `computed_at` did.
  void RecordExchange(const std::vector<int64_t>& computed_at,
                      const std::vector<PushResponse>& responses, absl::Time push_start);
  // A budget of training.pull_timeout_seconds from now.
  Retry NewRetry() const;
  // After `cause` (IsTransientShardError): registers again, with `retry`'s
  // backoff and jitter, until every shard answers, re-offers Init, and
  // pulls whatever the shards hold. Unavailable once `retry`'s deadline has
  // passed (a launcher restarts the worker); a refusal that is not
  // transient ends it with its own code.
  absl::Status Reconnect(const absl::Status& cause, Retry* retry);
  absl::StatusOr<LossResult> Evaluate(const Dataset& data);
  // Evaluates the final model and reports it, naming any missing workers;
  // an error when no training happened at all (the PS restored a finished
  // run) or when training.require_all_workers and some are missing.
  absl::Status EvaluateFinal(WorkerResult* result);
  bool is_chief() const { return rank_ == 0; }

  const JobConfig& config_;
  const int rank_;
  PsClient* client_;
  std::vector<Kernels*> backends_;
  const TrainingData* data_;
  std::unique_ptr<Towers> towers_;
  // The job's consistency rules, which say what to pull after a push.
  std::unique_ptr<const ConsistencyPolicy> policy_;
  std::unique_ptr<ShardSampler> sampler_;
  std::vector<std::span<float>> parameters_;
  std::vector<std::span<const float>> gradients_;
  std::vector<std::string> variable_names_;  // of gradients_, for their metrics
  // LAYERWISE: the exchange in flight since the last step, and what it pushed.
  std::unique_ptr<StepExchange> exchange_;
  std::vector<int64_t> exchange_computed_at_;
  absl::Time exchange_start_;
  std::vector<int> push_order_;        // variables, last layer first
  std::vector<int64_t> versions_;      // each shard's version at the last pull
  std::vector<int64_t> next_min_;      // the version each shard must reach before the next pull
  // The last step's PushPull left the next step's parameters in
  // parameters_ (and on the device): the step need not pull.
  bool parameters_current_ = false;
  std::span<float> batch_x_;  // the Mlp's (pinned) input staging buffer
  std::span<float> batch_y_;  // the Mlp's (pinned) target staging buffer
  // Towers on host memory gather the next step's batch into batch_x_ and
  // batch_y_ while the step's exchange is out (the cores are idle then, but
  // for the shard's), so the next step starts computing at once.
  // `gathered_` is the (epoch, step) whose rows they hold once `gather_`
  // is over; a step redone after a failed exchange gathers its own again.
  ThreadPool gather_thread_{1};
  ThreadPool::Task gather_;
  std::pair<int, int64_t> gathered_{-1, -1};
  int64_t resume_clock_ = 0;           // steps this worker had done before a restart
  std::function<void()> before_push_;
  bool live_progress_ = false;
  std::unique_ptr<Progress> progress_;
  double train_seconds_ = 0.0;
  double last_epoch_loss_ = 0.0;
  EventWriter* events_ = nullptr;
  std::unique_ptr<RunRecorder> recorder_;
  int64_t window_staleness_ = 0;       // sum of shard 0's staleness since the last window
};

}  // namespace pst

#endif  // PST_WORKER_TRAINING_TRAINER_H_
