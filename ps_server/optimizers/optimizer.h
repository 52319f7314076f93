// Optimizer update rules, in one place. The parameter server owns one
// Optimizer per shard and calls Apply once per update of each variable.
#ifndef PST_PS_SERVER_OPTIMIZERS_OPTIMIZER_H_
#define PST_PS_SERVER_OPTIMIZERS_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/optimizer_config.h"
#include "config.pb.h"

namespace pst {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // "sgd", "momentum", "nesterov", "adam", "adamw", "adagrad" or "ftrl".
  virtual std::string Name() const = 0;

  // How many floats of state the optimizer keeps per parameter (0 for SGD,
  // 1 for momentum and Adagrad, 2 for Adam, AdamW and FTRL).
  virtual int SlotsPerParameter() const = 0;

  // Initial value of the state slots (Adagrad starts its accumulator at
  // initial_accumulator, everything else at 0).
  virtual float InitialSlotValue() const { return 0.0f; }

  // The memory of one update of `count` elements. The rule reads param,
  // grad and slots and writes param_out and slots_out, which may be the same
  // memory as param and slots (an in-place update) but must not otherwise
  // overlap them. Slot s of element i is slots[s * slot_stride + i] (and
  // likewise in slots_out).
  struct Range {
    size_t count = 0;
    const float* param = nullptr;
    const float* grad = nullptr;
    const float* slots = nullptr;
    float* param_out = nullptr;
    float* slots_out = nullptr;
    size_t slot_stride = 0;
  };

  // What one update of a variable applies with. `t` counts the updates
  // applied to the variable so far, including this one (1 for the first),
  // for Adam's bias correction. The learning rate is `learning_rate` (a
  // worker's optimizer's, when its push names one) or the configured one,
  // times `lr_scale`; AdamW's weight decay is `weight_decay` or the
  // configured one. Both given ones are finite and >= 0.
  struct Step {
    int64_t t = 1;
    float lr_scale = 1.0f;
    std::optional<float> learning_rate;
    std::optional<float> weight_decay;
  };

  // One update: param_out = param - rule(grad). Precondition: grad is
  // finite. The result of an element depends only on that element's
  // inputs, so a range may be split in any way (over threads, blocks) with
  // bitwise the same result.
  virtual void ApplyRange(const Step& step, const Range& range) const = 0;
  void ApplyRange(int64_t t, float lr_scale, const Range& range) const {
    ApplyRange(Step{.t = t, .lr_scale = lr_scale, .learning_rate = {}, .weight_decay = {}}, range);
  }

  // ApplyRange in place on a whole variable: `slots` holds
  // SlotsPerParameter() * param.size() floats laid out slot-major.
  // Precondition: grad.size() == param.size().
  void Apply(const Step& step, std::span<float> param, std::span<const float> grad,
             std::span<float> slots) const;
  void Apply(int64_t t, float lr_scale, std::span<float> param, std::span<const float> grad,
             std::span<float> slots) const {
    Apply(Step{.t = t, .lr_scale = lr_scale, .learning_rate = {}, .weight_decay = {}}, param, grad,
          slots);
  }

  // The configured decay's factor for update `step`: 1 without decay,
  // decay_rate ^ (step / decay_steps) otherwise.
  float DecayFactor(int64_t step) const;

 private:
  friend std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerSettings&);
  float decay_rate_ = 1.0f;
  int64_t decay_steps_ = 0;
};

// Builds the optimizer a config names; InvalidArgument for what
// ResolveOptimizerConfig (common/optimizer_config.h) refuses.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config);

// Builds the optimizer resolved settings describe.
std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerSettings& settings);

}  // namespace pst

#endif  // PST_PS_SERVER_OPTIMIZERS_OPTIMIZER_H_
