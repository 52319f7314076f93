// The optimizer a config names, checked, with its documented defaults
// filled in. Config validation refuses exactly what this refuses, and the PS
// builds its optimizer (ps_server/optimizers/optimizer.h) from what this returns, so a
// config that loads is a config every PS can build its optimizer for.
#ifndef PST_COMMON_OPTIMIZER_CONFIG_H_
#define PST_COMMON_OPTIMIZER_CONFIG_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "config.pb.h"

namespace pst {

struct OptimizerSettings {
  // SGD with momentum 0 and no Nesterov is kSgd; with either, kMomentum or
  // kNesterov.
  enum class Rule { kSgd, kMomentum, kNesterov, kAdam, kAdagrad, kFtrl, kAdamW };
  Rule rule = Rule::kSgd;
  float learning_rate = 0.0f;
  float momentum = 0.0f;             // kMomentum, kNesterov
  float beta1 = 0.0f;                // kAdam, kAdamW
  float beta2 = 0.0f;                // kAdam, kAdamW
  float epsilon = 0.0f;              // kAdam, kAdamW, kAdagrad
  float weight_decay = 0.0f;         // kAdamW
  float initial_accumulator = 0.0f;  // kAdagrad, kFtrl
  float beta = 0.0f;                 // kFtrl
  float l1 = 0.0f;                   // kFtrl
  float l2 = 0.0f;                   // kFtrl
  // The learning rate is multiplied by decay_rate ^ (step / decay_steps);
  // decay_steps 0 means no decay.
  float decay_rate = 1.0f;
  int64_t decay_steps = 0;
};

// InvalidArgument for a missing optimizer, a non-positive learning rate, or
// hyperparameters out of range (momentum and betas in [0, 1), epsilon
// positive, FTRL's beta, l1, l2 and initial_accumulator finite and >= 0,
// AdamW's weight_decay finite and >= 0, clip_norm finite and >= 0,
// decay_steps >= 0 and, with decay, decay_rate in (0, 1]).
absl::StatusOr<OptimizerSettings> ResolveOptimizerConfig(const OptimizerConfig& config);

}  // namespace pst

#endif  // PST_COMMON_OPTIMIZER_CONFIG_H_
