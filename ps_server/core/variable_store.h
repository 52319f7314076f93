// The variables one PS shard holds, with their optimizer state.
//
// Not thread-safe: the ParameterShard that owns it serializes access.
// Nothing here changes a variable unless the whole update has been validated
// first, so a rejected request never leaves the model half-updated.
#ifndef PST_PS_SERVER_CORE_VARIABLE_STORE_H_
#define PST_PS_SERVER_CORE_VARIABLE_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps.pb.h"
#include "ps_server/core/update_settings.h"
#include "ps_server/optimizers/optimizer.h"

namespace pst {

// A variable's values. Shared and never written once published: an update
// stages new values in another buffer and swaps it in, so a pull may keep
// sending a reference to the old ones after the shard's lock is released
// (copy on write, without the copy while nobody holds the old buffer).
using Values = std::shared_ptr<std::vector<float>>;

struct Variable {
  std::string name;
  std::vector<int64_t> shape;
  Values values = std::make_shared<std::vector<float>>();
  std::vector<float> slots;  // optimizer state, Optimizer::SlotsPerParameter() per value
  int64_t updates = 0;       // optimizer steps applied to this variable
  size_t size() const { return values->size(); }
};

class VariableStore {
 public:
  explicit VariableStore(std::unique_ptr<Optimizer> optimizer);

  bool initialized() const { return initialized_; }
  size_t size() const { return variables_.size(); }
  int64_t parameter_bytes() const;
  const Optimizer& optimizer() const { return *optimizer_; }
  // The optimizer an Init named for the dense variables (InitRequest.optimizer),
  // if any: it replaces the job's and goes into checkpoints.
  const std::optional<OptimizerConfig>& named_optimizer() const { return named_optimizer_; }
  // Makes `config` (null: the job's) the variables' optimizer before
  // Initialize. InvalidArgument, and no change, for what MakeOptimizer
  // refuses. Precondition: !initialized().
  absl::Status UseOptimizer(const OptimizerConfig* config);

  // Creates the variables from `tensors`. InvalidArgument for an empty list
  // (unless `may_be_empty`: a shard that holds only embedding rows), a
  // duplicate or empty name, a non-positive dimension, a payload that does
  // not match its shape, or a non-finite value. Precondition: !initialized().
  absl::Status Initialize(const google::protobuf::RepeatedPtrField<Tensor>& tensors,
                          bool may_be_empty = false);

  // Index of the variable called `name`, or -1.
  int Find(const std::string& name) const;
  const Variable& variable(int index) const { return variables_[index]; }
  const std::vector<Variable>& variables() const { return variables_; }

  // Checks that `gradients` name distinct known variables with payloads of the
  // right size and (when `check_finite`) only finite values, and (when
  // `require_all`) that every variable is present. On success fills
  // `indices` with each gradient's variable index. InvalidArgument naming
  // the first offending tensor.
  absl::Status ValidateGradients(const google::protobuf::RepeatedPtrField<Tensor>& gradients,
                                 bool require_all, bool check_finite,
                                 std::vector<int>* indices) const;
  // InvalidArgument naming the first variable not flagged in `seen` (one
  // flag per variable): SYNC's rule that a push covers the whole shard.
  absl::Status CheckEveryVariableSeen(const std::vector<bool>& seen) const;
  // What ValidateGradients checks of one gradient before its payload: a
  // known variable, not already in `seen` (one flag per variable, which
  // this sets), and the variable's shape if it names one. The variable's
  // index, or InvalidArgument naming the gradient.
  absl::StatusOr<int> CheckGradientHeader(const Tensor& gradient, std::vector<bool>* seen) const;

  // Copies every variable, its optimizer state and update count out,
  // into `checkpoint`'s variables where it has them (PresizeExport's:
  // their bytes are copied into the memory already there), else new ones.
  void Export(ShardCheckpoint* checkpoint) const;
  // The bytes of each variable's values and optimizer state, in order.
  std::vector<std::pair<size_t, size_t>> ExportBytes() const;
  // Gives `checkpoint` one variable per entry of `bytes` (ExportBytes),
  // its values and state that many bytes, written once: so that Export,
  // under the shard's lock, copies into memory whose pages are in, rather
  // than taking fresh pages (a fault each) while updates wait.
  static void PresizeExport(const std::vector<std::pair<size_t, size_t>>& bytes,
                            ShardCheckpoint* checkpoint);
  // Replaces the store's contents with a checkpoint's. InvalidArgument (and
  // no change) if it does not fit this store's optimizer.
  absl::Status Restore(const ShardCheckpoint& checkpoint);

  // One update is a set of optimizer steps applied all or nothing. Stage()
  // runs one variable's step (with `gradient`, already validated) on copies
  // of its values and optimizer state; nothing visible changes. It fails with
  // InvalidArgument, naming the variable, if the step would make a value or
  // the optimizer state non-finite (a finite gradient can still overflow,
  // e.g. Adam's squared gradient). Commit() then makes every staged step
  // visible at once (a buffer swap per variable); Discard() drops them. A
  // variable is staged at most once per update. `settings` gives the
  // step's learning rate, weight decay and gradient scale.
  absl::Status Stage(int index, std::span<const float> gradient, const UpdateSettings& settings);
  void Commit();
  void Discard();

  // Stage() in steps, for a gradient that arrives piece by piece:
  // BeginStage readies the variable's staging buffers and returns a target
  // that applies the optimizer to any range of elements; FinishStage checks
  // the result, as Stage does, and includes it in the next Commit. A target
  // reads the variable's published values and state and writes only its
  // own buffers, so it may run without the owner's lock, provided the owner
  // lets no other update, Commit or Restore touch the store until
  // FinishStage (or until it gives the target up, which needs no call).
  class StageTarget {
   public:
    // Applies the step to elements [first, first + gradient.size()) from
    // `gradient` (already validated). Each element is staged once per
    // update; every one must be by FinishStage.
    void Apply(size_t first, std::span<const float> gradient);
    // Takes in what a copy of this target (staging other elements of the
    // same update, e.g. on another thread) found.
    void Merge(const StageTarget& other) { non_finite_ |= other.non_finite_; }
    // Whether every value staged so far is finite.
    bool finite() const { return non_finite_ == 0; }

   private:
    friend class VariableStore;
    const Optimizer* optimizer_ = nullptr;
    Optimizer::Step step_;
    float gradient_scale_ = 1.0f;
    int slots_ = 0;  // per parameter
    std::span<const float> values_, state_;  // published
    std::span<float> next_values_, next_state_;
    char* record_ = nullptr;  // the gradient's copy while recording, or null
    uint32_t non_finite_ = 0;
  };
  absl::StatusOr<StageTarget> BeginStage(int index, const UpdateSettings& settings);
  absl::Status FinishStage(int index, const StageTarget& target);
  // Forwarding to backups. While recording, each update committed keeps,
  // per variable it staged, the gradient given to its target and the
  // optimizer step (DenseStep), until TakeSteps; RecordSteps drops what
  // is kept. TakeSteps moves the steps of the update committed since the
  // last call (none if none was) into `steps` and returns true; false,
  // with `steps` empty, where they do not tell the change: not recording,
  // more than one update committed, or the variables replaced
  // (Initialize, Restore) since.
  void RecordSteps(bool record);
  bool TakeSteps(DenseSteps* steps);
  // A backup's side. CheckReplayed: the index of the variable `step` (a
  // primary's) names, which it marks in `seen`; InvalidArgument for an
  // unknown variable or one in `seen`, a gradient of another size or with
  // a non-finite value, an update count that does not follow the
  // variable's, or settings no primary uses (non-finite, negative rates).
  // BeginReplayed, for a step CheckReplayed passed: stages it as
  // BeginStage does, with the step's optimizer settings; the caller
  // applies the step's gradient to the target and finishes (FinishStage).
  absl::StatusOr<int> CheckReplayed(const DenseStep& step, std::vector<bool>* seen) const;
  StageTarget BeginReplayed(int index, const DenseStep& step);

  // The buffer BeginStage(index) stages the new values into: the values
  // the variable has once the update is committed, for a caller that sends
  // them on as they are staged. Holding it past the update makes the next
  // BeginStage of the variable stage into a new buffer.
  const Values& staged_values(int index) const { return staged_[index].values; }

 private:
  // The next values and optimizer state of a staged variable. Kept between
  // updates, so staging reuses warm memory: after a commit `values` is the
  // variable's previous buffer, reused unless a pull still holds it.
  struct Staged {
    Values values;
    std::vector<float> slots;
    DenseStep step;  // while recording: the step staged
  };

  StageTarget BeginStageWith(int index, const Optimizer::Step& step, float gradient_scale);
  // Drops what is recorded; a change since the last TakeSteps that the
  // steps will not tell (`lost`) makes the next TakeSteps false.
  void DropSteps(bool lost);

  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Optimizer> job_optimizer_;  // the job's, while named_optimizer_ replaces it
  std::optional<OptimizerConfig> named_optimizer_;
  std::vector<Variable> variables_;
  std::vector<Staged> staged_;        // parallel to variables_
  std::vector<int> staged_indices_;   // staged in the current update
  std::map<std::string, int, std::less<>> index_;
  bool initialized_ = false;
  bool recording_ = false;
  DenseSteps recorded_;       // the steps committed since TakeSteps
  int updates_recorded_ = 0;  // updates committed since TakeSteps
  bool steps_lost_ = false;
};

// InvalidArgument naming `what` unless every value is finite.
absl::Status CheckFinite(std::span<const float> values, const std::string& what);
// Whether every value is finite: a branch-free pass the compiler
// vectorizes, for the hot paths (pushes, restored and replicated state).
bool AllFinite(std::span<const float> values);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_VARIABLE_STORE_H_
