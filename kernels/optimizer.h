// Optimizer update rules, in one place. The parameter server owns one
// Optimizer per shard and calls Apply once per update of each variable.
#ifndef PST_KERNELS_OPTIMIZER_H_
#define PST_KERNELS_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "config.pb.h"

namespace pst {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // "sgd", "momentum", "nesterov", "adam" or "adagrad".
  virtual std::string Name() const = 0;

  // How many floats of state the optimizer keeps per parameter (0 for SGD,
  // 1 for momentum and Adagrad, 2 for Adam).
  virtual int SlotsPerParameter() const = 0;

  // Initial value of the state slots (Adagrad starts its accumulator at
  // initial_accumulator, everything else at 0).
  virtual float InitialSlotValue() const { return 0.0f; }

  // One update: param -= rule(grad). `step` counts the updates applied to
  // this variable so far, including this one (1 for the first), for Adam's
  // bias correction. `lr_scale` multiplies the configured learning rate.
  // `slots` holds SlotsPerParameter() * param.size() floats laid out
  // slot-major: slot s of element i is slots[s * param.size() + i].
  // Preconditions: grad.size() == param.size(); grad is finite.
  virtual void Apply(int64_t step, float lr_scale, std::span<float> param,
                     std::span<const float> grad, std::span<float> slots) const = 0;

  // The configured decay's factor for update `step`: 1 without decay,
  // decay_rate ^ (step / decay_steps) otherwise.
  float DecayFactor(int64_t step) const;

 private:
  friend absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig&);
  float decay_rate_ = 1.0f;
  int64_t decay_steps_ = 0;
};

// Builds the optimizer a config names; InvalidArgument for a missing
// optimizer or a non-positive learning rate, or hyperparameters out of range.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config);

}  // namespace pst

#endif  // PST_KERNELS_OPTIMIZER_H_
