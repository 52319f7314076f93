#include "ps_server/core/variable_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace pst {

namespace {

// Elements staged at a time: a block of values, gradient and optimizer
// state stays in L1 while it is updated and checked.
constexpr size_t kStageBlock = 2048;

// Nonzero when a value is Inf or NaN, i.e. its exponent bits are all ones.
// Integer-only and branch-free, so the compiler vectorizes it.
uint32_t NonFiniteBits(const float* values, size_t n) {
  uint32_t non_finite = 0;
  for (size_t i = 0; i < n; ++i) {
    non_finite |= (std::bit_cast<uint32_t>(values[i]) & 0x7f800000u) == 0x7f800000u;
  }
  return non_finite;
}

}  // namespace

bool AllFinite(std::span<const float> values) {
  return NonFiniteBits(values.data(), values.size()) == 0;
}

absl::Status CheckFinite(std::span<const float> values, const std::string& what) {
  // The fast pass decides; a second scan only names the culprit.
  if (NonFiniteBits(values.data(), values.size()) == 0) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has a non-finite value (", values[i], ") at element ", i,
                       "; nothing was applied"));
    }
  }
  return absl::OkStatus();
}


VariableStore::VariableStore(std::unique_ptr<Optimizer> optimizer)
    : optimizer_(std::move(optimizer)) {}

absl::Status VariableStore::UseOptimizer(const OptimizerConfig* config) {
  if (config == nullptr) {
    if (job_optimizer_ != nullptr) optimizer_ = std::move(job_optimizer_);
    named_optimizer_.reset();
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = MakeOptimizer(*config);
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Init's optimizer: ", optimizer.status().message()));
  }
  if (job_optimizer_ == nullptr) job_optimizer_ = std::move(optimizer_);
  optimizer_ = *std::move(optimizer);
  named_optimizer_ = *config;
  return absl::OkStatus();
}

int64_t VariableStore::parameter_bytes() const {
  int64_t bytes = 0;
  for (const Variable& v : variables_) bytes += v.size() * sizeof(float);
  return bytes;
}

absl::Status VariableStore::Initialize(const google::protobuf::RepeatedPtrField<Tensor>& tensors,
                                      bool may_be_empty) {
  if (tensors.empty() && !may_be_empty) {
    return absl::InvalidArgumentError("Init carries no variables and no embedding tables");
  }
  std::vector<Variable> variables;
  std::map<std::string, int, std::less<>> index;
  std::vector<float> scratch;
  for (const Tensor& tensor : tensors) {
    if (tensor.name().empty()) return absl::InvalidArgumentError("Init has a variable with no name");
    if (!index.emplace(tensor.name(), static_cast<int>(variables.size())).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Init names variable \"", tensor.name(), "\" twice"));
    }
    if (tensor.shape().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable \"", tensor.name(), "\" has no shape"));
    }
    for (int64_t d : tensor.shape()) {
      if (d <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", tensor.name(), "\" has a non-positive dimension ", d));
      }
    }
    int64_t elements = NumElements({tensor.shape().data(), static_cast<size_t>(tensor.shape().size())});
    PST_RETURN_IF_ERROR(CheckTensorPayload(tensor, elements));
    Variable v;
    v.name = tensor.name();
    v.shape.assign(tensor.shape().begin(), tensor.shape().end());
    v.values->resize(elements);
    DecodeTensor(tensor, *v.values);
    if (absl::Status s = CheckFinite(*v.values, absl::StrCat("variable \"", v.name, "\""));
        !s.ok()) {
      return s;
    }
    v.slots.assign(static_cast<size_t>(elements) * optimizer_->SlotsPerParameter(),
                   optimizer_->InitialSlotValue());
    variables.push_back(std::move(v));
  }
  variables_ = std::move(variables);
  index_ = std::move(index);
  initialized_ = true;
  DropSteps(/*lost=*/true);
  return absl::OkStatus();
}

void VariableStore::Export(ShardCheckpoint* checkpoint) const {
  checkpoint->set_optimizer(optimizer_->Name());
  if (named_optimizer_.has_value()) *checkpoint->mutable_dense_optimizer() = *named_optimizer_;
  const int presized = checkpoint->variables_size();
  for (size_t i = 0; i < variables_.size(); ++i) {
    const Variable& v = variables_[i];
    ShardCheckpoint::Variable* out = static_cast<int>(i) < presized
                                         ? checkpoint->mutable_variables(static_cast<int>(i))
                                         : checkpoint->add_variables();
    out->set_name(v.name);
    out->mutable_shape()->Assign(v.shape.begin(), v.shape.end());
    // assign, not set_values: a presized string keeps its memory.
    out->mutable_values()->assign(reinterpret_cast<const char*>(v.values->data()),
                                  v.size() * sizeof(float));
    out->mutable_slots()->assign(reinterpret_cast<const char*>(v.slots.data()),
                                 v.slots.size() * sizeof(float));
    out->set_updates(v.updates);
  }
  if (presized > static_cast<int>(variables_.size())) {
    const int first = static_cast<int>(variables_.size());
    checkpoint->mutable_variables()->DeleteSubrange(first, presized - first);
  }
}

std::vector<std::pair<size_t, size_t>> VariableStore::ExportBytes() const {
  std::vector<std::pair<size_t, size_t>> bytes;
  bytes.reserve(variables_.size());
  for (const Variable& v : variables_) {
    bytes.emplace_back(v.size() * sizeof(float), v.slots.size() * sizeof(float));
  }
  return bytes;
}

void VariableStore::PresizeExport(const std::vector<std::pair<size_t, size_t>>& bytes,
                                  ShardCheckpoint* checkpoint) {
  for (const auto& [values, slots] : bytes) {
    ShardCheckpoint::Variable* out = checkpoint->add_variables();
    out->mutable_values()->resize(values);  // zero-filled: every page written
    out->mutable_slots()->resize(slots);
  }
}

absl::Status VariableStore::Restore(const ShardCheckpoint& checkpoint) {
  // The optimizer an Init named travels with the checkpoint; without one
  // the state is the job's optimizer's.
  std::unique_ptr<Optimizer> named;
  const Optimizer* rule = job_optimizer_ != nullptr ? job_optimizer_.get() : optimizer_.get();
  if (checkpoint.has_dense_optimizer()) {
    absl::StatusOr<std::unique_ptr<Optimizer>> made = MakeOptimizer(checkpoint.dense_optimizer());
    if (!made.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint's optimizer: ", made.status().message()));
    }
    named = *std::move(made);
    rule = named.get();
  }
  if (checkpoint.optimizer() != rule->Name()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint holds ", checkpoint.optimizer(), " state but this job uses ",
        rule->Name()));
  }
  std::vector<Variable> variables;
  std::map<std::string, int, std::less<>> index;
  for (const ShardCheckpoint::Variable& in : checkpoint.variables()) {
    Variable v;
    v.name = in.name();
    v.shape.assign(in.shape().begin(), in.shape().end());
    const int64_t elements = NumElements(v.shape);
    const size_t slots = static_cast<size_t>(elements) * rule->SlotsPerParameter();
    if (elements <= 0 || in.values().size() != elements * sizeof(float) ||
        in.slots().size() != slots * sizeof(float) || !index.emplace(v.name, variables.size()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint variable \"", in.name(), "\" is inconsistent"));
    }
    v.values->resize(elements);
    std::memcpy(v.values->data(), in.values().data(), in.values().size());
    // Plain SGD keeps no slots: an empty vector's data() may be null, which
    // memcpy must not be given even for zero bytes.
    v.slots.resize(slots);
    // An optimizer without state (plain SGD) has no slots: nothing to copy,
    // and memcpy must not see the empty vector's null pointer.
    if (slots > 0) std::memcpy(v.slots.data(), in.slots().data(), in.slots().size());
    // The shard never writes a non-finite value (it refuses such pushes and
    // skips such steps), so one here was not written by a PS.
    if (!AllFinite(*v.values) || !AllFinite(v.slots)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint variable \"", in.name(), "\" holds a non-finite value, which no PS writes"));
    }
    v.updates = in.updates();
    variables.push_back(std::move(v));
  }
  if (named != nullptr) {
    if (job_optimizer_ == nullptr) job_optimizer_ = std::move(optimizer_);
    optimizer_ = std::move(named);
    named_optimizer_ = checkpoint.dense_optimizer();
  } else if (job_optimizer_ != nullptr) {
    optimizer_ = std::move(job_optimizer_);
    named_optimizer_.reset();
  }
  variables_ = std::move(variables);
  index_ = std::move(index);
  initialized_ = true;
  DropSteps(/*lost=*/true);
  return absl::OkStatus();
}

int VariableStore::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

absl::Status VariableStore::ValidateGradients(
    const google::protobuf::RepeatedPtrField<Tensor>& gradients, bool require_all,
    bool check_finite, std::vector<int>* indices) const {
  indices->clear();
  std::vector<bool> seen(variables_.size(), false);
  std::vector<float> scratch;
  for (const Tensor& gradient : gradients) {
    absl::StatusOr<int> index = CheckGradientHeader(gradient, &seen);
    if (!index.ok()) return index.status();
    const Variable& v = variables_[*index];
    PST_RETURN_IF_ERROR(CheckTensorPayload(gradient, v.size()));
    if (check_finite && !EncodedFinite(gradient.data(), gradient.dtype())) {  // name the culprit
      if (absl::Status s = CheckFinite(TensorValues(gradient, &scratch),
                                       absl::StrCat("gradient for \"", v.name, "\""));
          !s.ok()) {
        return s;
      }
    }
    indices->push_back(*index);
  }
  return require_all ? CheckEveryVariableSeen(seen) : absl::OkStatus();
}

absl::Status VariableStore::CheckEveryVariableSeen(const std::vector<bool>& seen) const {
  for (size_t i = 0; i < variables_.size(); ++i) {
    if (!seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("push is missing the gradient for \"", variables_[i].name,
                       "\"; in SYNC mode every push must cover every variable of the shard"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> VariableStore::CheckGradientHeader(const Tensor& gradient,
                                                       std::vector<bool>* seen) const {
  const int index = Find(gradient.name());
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown variable \"", gradient.name(), "\" in a gradient push"));
  }
  if ((*seen)[index]) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient for \"", gradient.name(), "\" appears twice in one push"));
  }
  (*seen)[index] = true;
  const Variable& v = variables_[index];
  if (!gradient.shape().empty() &&
      !std::equal(gradient.shape().begin(), gradient.shape().end(), v.shape.begin(),
                  v.shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient for \"", v.name, "\" has the wrong shape; the variable has ", v.shape.size(),
        " dimension(s) and ", v.size(), " values"));
  }
  return index;
}

absl::Status VariableStore::Stage(int index, std::span<const float> gradient,
                                  const UpdateSettings& settings) {
  absl::StatusOr<StageTarget> target = BeginStage(index, settings);
  if (!target.ok()) return target.status();
  target->Apply(0, gradient);
  return FinishStage(index, *target);
}

absl::StatusOr<VariableStore::StageTarget> VariableStore::BeginStage(
    int index, const UpdateSettings& settings) {
  const Variable& v = variables_[index];
  const Optimizer::Step step = settings.StepOf(*optimizer_, v.name, v.updates + 1);
  StageTarget target = BeginStageWith(index, step, settings.gradient_scale);
  if (recording_) {
    DenseStep& record = staged_[index].step;
    record.set_name(v.name);
    record.mutable_gradient()->resize(v.size() * sizeof(float));
    record.set_gradient_scale(settings.gradient_scale);
    record.set_lr_scale(step.lr_scale);
    if (step.learning_rate.has_value()) {
      record.set_learning_rate(*step.learning_rate);
    } else {
      record.clear_learning_rate();
    }
    if (step.weight_decay.has_value()) {
      record.set_weight_decay(*step.weight_decay);
    } else {
      record.clear_weight_decay();
    }
    record.set_update(step.t);
    target.record_ = record.mutable_gradient()->data();
  }
  return target;
}

absl::StatusOr<int> VariableStore::CheckReplayed(const DenseStep& step,
                                                 std::vector<bool>* seen) const {
  const int index = Find(step.name());
  if (index < 0 || (*seen)[index]) {
    return absl::InvalidArgumentError(absl::StrCat("the update steps ",
                                                   index < 0 ? "an unknown" : "a repeated",
                                                   " variable \"", step.name(), "\""));
  }
  (*seen)[index] = true;
  const Variable& v = variables_[index];
  if (step.gradient().size() != v.size() * sizeof(float) || step.update() != v.updates + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update's step of \"", v.name, "\" (", step.gradient().size(),
                     " bytes, update ", step.update(), ") does not follow the variable (",
                     v.size() * sizeof(float), " bytes, update ", v.updates, ")"));
  }
  const auto usable = [](float x) { return std::isfinite(x) && x >= 0.0f; };
  if (!std::isfinite(step.gradient_scale()) || !usable(step.lr_scale()) ||
      (step.has_learning_rate() && !usable(step.learning_rate())) ||
      (step.has_weight_decay() && !usable(step.weight_decay()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update's step of \"", v.name, "\" has a non-finite or negative rate"));
  }
  if (!EncodedFinite(step.gradient(), FLOAT32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update's gradient of \"", v.name, "\" holds a non-finite value"));
  }
  return index;
}

VariableStore::StageTarget VariableStore::BeginReplayed(int index, const DenseStep& step) {
  Optimizer::Step settings{
      .t = step.update(), .lr_scale = step.lr_scale(), .learning_rate = {}, .weight_decay = {}};
  if (step.has_learning_rate()) settings.learning_rate = step.learning_rate();
  if (step.has_weight_decay()) settings.weight_decay = step.weight_decay();
  return BeginStageWith(index, settings, step.gradient_scale());
}

VariableStore::StageTarget VariableStore::BeginStageWith(int index, const Optimizer::Step& step,
                                                         float gradient_scale) {
  const Variable& v = variables_[index];
  if (staged_.size() != variables_.size()) staged_.resize(variables_.size());
  Staged& next = staged_[index];
  next.step.clear_name();  // recorded: BeginStage names it
  const int slots = optimizer_->SlotsPerParameter();
  if (next.values == nullptr || next.values.use_count() > 1) {
    // A pull is still sending this buffer (it held the values before the
    // last commit): leave it to that pull and stage into a new one.
    next.values = std::make_shared<std::vector<float>>();
  } else {
    // The pull that held it is done; its reads happened before its release.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  next.values->resize(v.size());
  next.slots.resize(v.slots.size());
  StageTarget target;
  target.optimizer_ = optimizer_.get();
  target.step_ = step;
  target.gradient_scale_ = gradient_scale;
  target.slots_ = slots;
  target.values_ = *v.values;
  target.state_ = v.slots;
  target.next_values_ = *next.values;
  target.next_state_ = next.slots;
  return target;
}

void VariableStore::StageTarget::Apply(size_t first, std::span<const float> gradient) {
  const size_t n = values_.size();
  // One fused pass, block by block: the optimizer reads the published values
  // and state and writes the staged ones, and each block is checked for
  // non-finite results while it is still in cache.
  // Without state (SGD) there is no slot memory to point into.
  const bool has_state = slots_ > 0;
  if (record_ != nullptr) {
    std::memcpy(record_ + first * sizeof(float), gradient.data(), gradient.size_bytes());
  }
  // A clipped gradient is scaled block by block, as it is applied.
  std::array<float, kStageBlock> scaled;
  for (size_t done = 0; done < gradient.size(); done += kStageBlock) {
    const size_t begin = first + done;
    const size_t len = std::min(kStageBlock, gradient.size() - done);
    const float* grad = gradient.data() + done;
    if (gradient_scale_ != 1.0f) {
      for (size_t i = 0; i < len; ++i) scaled[i] = grad[i] * gradient_scale_;
      grad = scaled.data();
    }
    optimizer_->ApplyRange(
        step_,
        Optimizer::Range{.count = len,
                         .param = values_.data() + begin,
                         .grad = grad,
                         .slots = has_state ? state_.data() + begin : nullptr,
                         .param_out = next_values_.data() + begin,
                         .slots_out = has_state ? next_state_.data() + begin : nullptr,
                         .slot_stride = n});
    non_finite_ |= NonFiniteBits(next_values_.data() + begin, len);
    for (int s = 0; s < slots_; ++s) {
      non_finite_ |= NonFiniteBits(next_state_.data() + s * n + begin, len);
    }
  }
}

absl::Status VariableStore::FinishStage(int index, const StageTarget& target) {
  if (target.non_finite_ != 0) {  // name the culprit
    const Variable& v = variables_[index];
    const Staged& next = staged_[index];
    absl::Status finite =
        CheckFinite(*next.values, absl::StrCat("the update of \"", v.name, "\""));
    if (finite.ok()) {
      finite = CheckFinite(next.slots, absl::StrCat("the optimizer state of \"", v.name, "\""));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        finite.message(), " (the gradient is too large for the ", optimizer_->Name(),
        " optimizer); the variable keeps its values"));
  }
  staged_indices_.push_back(index);
  return absl::OkStatus();
}

void VariableStore::Commit() {
  // Recorded only if every variable staged was recorded (not a backup's
  // replayed step, BeginReplayed).
  bool recorded = recording_ && !staged_indices_.empty();
  for (int index : staged_indices_) {
    recorded = recorded && !staged_[index].step.name().empty();
  }
  if (recording_ && !staged_indices_.empty() && (!recorded || updates_recorded_++ > 0)) {
    DropSteps(/*lost=*/true);
  }
  for (int index : staged_indices_) {
    Variable& v = variables_[index];
    Staged& staged = staged_[index];
    v.values.swap(staged.values);
    v.slots.swap(staged.slots);
    ++v.updates;
    if (recorded && !steps_lost_) recorded_.add_steps()->Swap(&staged.step);
    staged.step.Clear();
  }
  staged_indices_.clear();
}

void VariableStore::Discard() {
  for (int index : staged_indices_) staged_[index].step.Clear();
  staged_indices_.clear();
}

void VariableStore::RecordSteps(bool record) {
  recording_ = record;
  DropSteps(/*lost=*/false);
}

bool VariableStore::TakeSteps(DenseSteps* steps) {
  const bool told = recording_ && !steps_lost_;
  steps->Clear();
  if (told) steps->Swap(&recorded_);
  DropSteps(/*lost=*/false);
  return told;
}

void VariableStore::DropSteps(bool lost) {
  recorded_.Clear();
  updates_recorded_ = 0;
  steps_lost_ = lost;
}

}  // namespace pst
