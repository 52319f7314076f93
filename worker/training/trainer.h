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
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "config.pb.h"
#include "kernels/kernels.h"
#include "result.pb.h"
#include "worker/client/ps_client.h"
#include "worker/client/step_exchange.h"
#include "worker/model/mlp.h"
#include "worker/model/towers.h"
#include "worker/report/run_recorder.h"
#include "worker/session/training_session.h"
#include "worker/training/dataset.h"
#include "worker/training/progress.h"

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
  void set_live_progress(bool live) { report_.live = live; }

  // The chief writes TensorBoard scalars here (train/loss, train/samples_per_sec,
  // train/staleness, test/loss, test/accuracy); null = none. Borrowed.
  void set_event_writer(EventWriter* events) { report_.events = events; }

  // Trains to the end. A step refused for now (a shard busy, restarting)
  // is redone by the session (TrainingSession::Redo); Unavailable /
  // DeadlineExceeded when a shard stops answering for longer;
  // InvalidArgument when the data set is too small for the batch.
  absl::StatusOr<WorkerResult> Run();

 private:
  // The model's tensors as the exchanges see them.
  struct Tensors {
    std::vector<std::span<float>> parameters;
    std::vector<std::span<const float>> gradients;
    std::vector<std::string> names;  // of the gradients, for their metrics
    std::vector<int> push_order;     // variables, last layer first (LAYERWISE)
  };
  // The batch in the towers' (pinned) staging buffers. Towers on host
  // memory gather the next step's batch there while the step's exchange is
  // out (the cores are idle then, but for the shard's), so the next step
  // starts computing at once. `gathered` is the (epoch, step) whose rows
  // they hold once `gather` is over; a step redone after a failed exchange
  // gathers its own again.
  struct Staging {
    std::span<float> x;
    std::span<float> y;
    ThreadPool thread{1};
    ThreadPool::Task gather;
    std::pair<int, int64_t> gathered{-1, -1};
  };
  // What the run reports as it goes.
  struct Report {
    bool live = false;
    EventWriter* events = nullptr;
    std::unique_ptr<Progress> progress;
    std::unique_ptr<RunRecorder> recorder;
    double train_seconds = 0.0;
    double last_epoch_loss = 0.0;
  };

  absl::Status Setup();
  absl::StatusOr<WorkerResult> Train(WorkerResult result);
  // Runs steps [first_step, steps_per_epoch) of `epoch`.
  absl::Status RunEpoch(int epoch, int64_t first_step, WorkerResult* result);
  // Reads the parameters the session says are due, onto every tower
  // (IfDue: unless the last exchange brought them).
  absl::Status PullParameters();
  absl::Status PullParametersIfDue();
  // Forward/backward on batch `step` of `epoch` (after a pull, unless the
  // last step's exchange brought the parameters back), then the exchange:
  // push the gradient, receive the next parameters.
  absl::StatusOr<LossResult> RunStep(int epoch, int64_t step);
  // RunStep with the exchange overlapped with computation (LAYERWISE): the
  // forward pass takes each layer's parameters as they arrive from the last
  // step's exchange, and backward pushes each layer's gradient as soon as
  // it is final. The step's exchange is still in flight when this returns.
  absl::StatusOr<LossResult> RunStepLayerwise(int epoch, int64_t step);
  // Ends the exchange in flight, if any: its values are the parameters
  // (uploaded to every tower if `upload`; the layer-wise forward pass
  // uploads them layer by layer).
  absl::Status FinishExchange(bool upload);
  absl::StatusOr<LossResult> Evaluate(const Dataset& data);
  // Evaluates the final model and reports it, naming any missing workers;
  // an error when no training happened at all (the PS restored a finished
  // run) or when training.require_all_workers and some are missing.
  absl::Status EvaluateFinal(WorkerResult* result);
  // The chief, on the final parameters: writes them to
  // training.export_model, if set, as psctl export does (common/npz.h).
  absl::Status ExportModel();
  bool is_chief() const { return rank_ == 0; }

  const JobConfig& config_;
  const int rank_;
  PsClient* client_;
  std::vector<Kernels*> backends_;
  const TrainingData* data_;
  std::unique_ptr<Towers> towers_;
  std::unique_ptr<ShardSampler> sampler_;
  // Versions, retries, heartbeats and metrics: everything about the shards.
  std::unique_ptr<TrainingSession> session_;
  Tensors tensors_;
  Staging staging_;
  // LAYERWISE: the exchange in flight since the last step.
  std::unique_ptr<StepExchange> exchange_;
  int64_t resume_clock_ = 0;  // steps this worker had done before a restart
  std::function<void()> before_push_;
  Report report_;
};

}  // namespace pst

#endif  // PST_WORKER_TRAINING_TRAINER_H_
