// The training loop of one worker of a click-through-rate job
// (training.model.ctr): streams its share of the training file (line i to
// worker i % workers), and for every step computes the CtrModel's gradients
// on the rows of the batch's unique ids, then, in one exchange, pushes the
// dense gradients and the row gradients and names the next batch's ids,
// whose rows come back with the next parameters once the step has landed.
//
// The chief (worker:0), once every worker is done, streams the test file,
// pulls the rows of each test batch's ids, and reports the test AUC and
// log-loss (and, for generated data, the planted model's AUC beside them).
#ifndef PST_WORKER_TRAINING_CTR_TRAINER_H_
#define PST_WORKER_TRAINING_CTR_TRAINER_H_

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "config.pb.h"
#include "data/ctr_generator.h"
#include "data/ctr_reader.h"
#include "kernels/kernels.h"
#include "result.pb.h"
#include "worker/client/ps_client.h"
#include "worker/model/ctr_model.h"
#include "worker/report/event_writer.h"
#include "worker/report/run_recorder.h"
#include "worker/session/training_session.h"
#include "worker/training/progress.h"

namespace pst {

// The model training.model.ctr describes over training.dataset.ctr's data.
CtrModelSpec CtrModelSpecFor(const TrainingConfig& training);

class CtrTrainer {
 public:
  // Borrowed pointers must outlive the trainer. `planted`: what the data's
  // planted model scores on the test file, when known.
  CtrTrainer(const JobConfig& config, int rank, PsClient* client, Kernels* kernels,
             std::optional<PlantedModel> planted);

  // Called in every step once the gradients are computed, before they are
  // pushed, on the training thread (again for a step redone); empty =
  // nothing.
  void set_before_push(std::function<void()> hook) { before_push_ = std::move(hook); }

  void set_live_progress(bool live) { live_progress_ = live; }
  // The chief writes TensorBoard scalars here; null = none. Borrowed.
  void set_event_writer(EventWriter* events) { events_ = events; }

  // Trains to the end. InvalidArgument for a training file too small for
  // the batch or a malformed line. A step refused for now (a shard busy,
  // restarting) is redone by the session (TrainingSession::Redo);
  // Unavailable / DeadlineExceeded when a shard stops answering for longer
  // (the launcher restarts the worker, which then trains its share again
  // from the shards' state).
  absl::StatusOr<WorkerResult> Run();

 private:
  // One batch with its rows: read, prepared, pulled, and its gradients.
  struct Slot {
    CtrBatch batch;
    CtrStepInput input;
    std::vector<float> rows;
    std::vector<float> wide;
    std::vector<float> row_grads;
    std::vector<float> wide_grads;
    // With the tables joint (CtrShardTables): the pulled rows and the
    // pushed gradients, each id's deep columns then its wide one.
    std::vector<float> joint_rows;
    std::vector<float> joint_grads;
    std::vector<RowValues> values;          // where the pulled rows go
    std::vector<RowGradients> gradients;    // what is pushed
  };

  absl::Status Setup();
  absl::Status RunEpoch(int epoch, WorkerResult* result);
  // Step `step` of an epoch on `current`'s batch: reads the parameters and
  // the batch's rows unless the last exchange brought them (`read_rows`:
  // the rows are not in yet), computes the gradients, calls
  // `before_exchange`, and exchanges them for the parameters and `next`'s
  // rows (none past the epoch's end).
  absl::StatusOr<LossResult> RunStep(Slot& current, Slot* next, bool read_rows,
                                     absl::FunctionRef<void()> before_exchange);
  // Reads this worker's next `examples` examples into `slot` and sizes its
  // row buffers for their unique ids.
  absl::Status Fill(CtrReader* reader, int examples, Slot* slot);
  // With the tables joint: `slot`'s pulled rows into its rows and wide
  // weights, and its gradients of both into its joint gradients.
  void SplitJointRows(Slot& slot) const;
  void JoinGradients(Slot& slot) const;
  absl::Status EvaluateFinal(WorkerResult* result);
  bool is_chief() const { return rank_ == 0; }

  const JobConfig& config_;
  const int rank_;
  PsClient* client_;
  Kernels* kernels_;
  const std::optional<PlantedModel> planted_;
  std::unique_ptr<TrainingSession> session_;
  std::unique_ptr<CtrModel> model_;
  std::unique_ptr<CtrReader> reader_;
  int64_t steps_per_epoch_ = 0;
  int deep_table_ = -1;
  int wide_table_ = -1;
  // Whether the shards keep the deep and wide rows as one table's
  // (deep_table_).
  bool joint_ = false;
  std::vector<std::span<float>> parameters_;
  std::vector<std::span<const float>> gradients_;
  std::vector<std::string> variable_names_;
  // The step's batch, the next one (its rows come with the step's
  // exchange), and the one after, read while the step's exchange waits on
  // the shards (on reader_thread_), so that reading and parsing the file
  // is off the step's path.
  Slot slots_[3];
  ThreadPool reader_thread_{1};
  std::function<void()> before_push_;
  bool live_progress_ = false;
  EventWriter* events_ = nullptr;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<RunRecorder> recorder_;
  double train_seconds_ = 0.0;
  double last_epoch_loss_ = 0.0;
};

}  // namespace pst

#endif  // PST_WORKER_TRAINING_CTR_TRAINER_H_
