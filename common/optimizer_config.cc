#include "common/optimizer_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pst {
namespace {

absl::Status CheckLearningRate(float lr, const char* optimizer) {
  if (!std::isfinite(lr) || lr <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(optimizer, " learning_rate must be a positive number, got ", lr));
  }
  return absl::OkStatus();
}

absl::Status CheckUnitInterval(float value, const char* name) {
  if (!std::isfinite(value) || value < 0.0f || value >= 1.0f) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

float OrDefault(float value, float fallback) { return value == 0.0f ? fallback : value; }

// Adam's and AdamW's shared part (AdamConfig, AdamWConfig): the rate, the
// betas and epsilon, with their defaults, checked; `name` names the rule.
template <typename Config>
absl::Status ResolveMoments(const Config& c, const char* name, OptimizerSettings* settings) {
  settings->learning_rate = c.learning_rate();
  settings->beta1 = OrDefault(c.beta1(), 0.9f);
  settings->beta2 = OrDefault(c.beta2(), 0.999f);
  settings->epsilon = OrDefault(c.epsilon(), 1e-8f);
  PST_RETURN_IF_ERROR(CheckLearningRate(c.learning_rate(), name));
  PST_RETURN_IF_ERROR(CheckUnitInterval(settings->beta1, absl::StrCat(name, " beta1").c_str()));
  PST_RETURN_IF_ERROR(CheckUnitInterval(settings->beta2, absl::StrCat(name, " beta2").c_str()));
  if (!(settings->epsilon > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " epsilon must be positive"));
  }
  return absl::OkStatus();
}

// The update rule and its hyperparameters; decay is left to the caller.
absl::StatusOr<OptimizerSettings> ResolveRule(const OptimizerConfig& config) {
  OptimizerSettings settings;
  switch (config.kind_case()) {
    case OptimizerConfig::kSgd: {
      const SgdConfig& c = config.sgd();
      PST_RETURN_IF_ERROR(CheckLearningRate(c.learning_rate(), "sgd"));
      PST_RETURN_IF_ERROR(CheckUnitInterval(c.momentum(), "sgd momentum"));
      settings.rule = c.nesterov()           ? OptimizerSettings::Rule::kNesterov
                      : c.momentum() != 0.0f ? OptimizerSettings::Rule::kMomentum
                                             : OptimizerSettings::Rule::kSgd;
      settings.learning_rate = c.learning_rate();
      settings.momentum = c.momentum();
      return settings;
    }
    case OptimizerConfig::kAdam:
      settings.rule = OptimizerSettings::Rule::kAdam;
      PST_RETURN_IF_ERROR(ResolveMoments(config.adam(), "adam", &settings));
      return settings;
    case OptimizerConfig::kAdamw: {
      const AdamWConfig& c = config.adamw();
      settings.rule = OptimizerSettings::Rule::kAdamW;
      PST_RETURN_IF_ERROR(ResolveMoments(c, "adamw", &settings));
      if (!std::isfinite(settings.epsilon)) {
        return absl::InvalidArgumentError("adamw epsilon must be positive");
      }
      settings.weight_decay = c.has_weight_decay() ? c.weight_decay() : 0.01f;
      if (!std::isfinite(settings.weight_decay) || settings.weight_decay < 0.0f) {
        return absl::InvalidArgumentError(absl::StrCat(
            "adamw weight_decay must be finite and >= 0, got ", settings.weight_decay));
      }
      return settings;
    }
    case OptimizerConfig::kAdagrad: {
      const AdagradConfig& c = config.adagrad();
      settings.rule = OptimizerSettings::Rule::kAdagrad;
      settings.learning_rate = c.learning_rate();
      settings.initial_accumulator = c.has_initial_accumulator() ? c.initial_accumulator() : 0.1f;
      settings.epsilon = OrDefault(c.epsilon(), 1e-7f);
      PST_RETURN_IF_ERROR(CheckLearningRate(c.learning_rate(), "adagrad"));
      if (!(settings.initial_accumulator >= 0.0f) || !(settings.epsilon > 0.0f)) {
        return absl::InvalidArgumentError(
            "adagrad initial_accumulator must be >= 0 and epsilon positive");
      }
      return settings;
    }
    case OptimizerConfig::kFtrl: {
      const FtrlConfig& c = config.ftrl();
      settings.rule = OptimizerSettings::Rule::kFtrl;
      settings.learning_rate = c.learning_rate();
      settings.beta = OrDefault(c.beta(), 1.0f);
      settings.l1 = c.l1();
      settings.l2 = c.l2();
      settings.initial_accumulator = c.initial_accumulator();
      PST_RETURN_IF_ERROR(CheckLearningRate(c.learning_rate(), "ftrl"));
      for (float value : {settings.beta, settings.l1, settings.l2, settings.initial_accumulator}) {
        if (!std::isfinite(value) || value < 0.0f) {
          return absl::InvalidArgumentError(
              "ftrl beta, l1, l2 and initial_accumulator must be finite and >= 0");
        }
      }
      return settings;
    }
    case OptimizerConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "no optimizer configured; set sgd, adam, adamw, adagrad or ftrl");
}

}  // namespace

absl::StatusOr<OptimizerSettings> ResolveOptimizerConfig(const OptimizerConfig& config) {
  if (config.decay_steps() < 0 ||
      (config.decay_steps() > 0 && !(config.decay_rate() > 0.0f && config.decay_rate() <= 1.0f))) {
    return absl::InvalidArgumentError(
        "learning-rate decay needs decay_steps >= 0 and decay_rate in (0, 1]");
  }
  if (!std::isfinite(config.clip_norm()) || config.clip_norm() < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_norm must be finite and >= 0 (0: off), got ", config.clip_norm()));
  }
  absl::StatusOr<OptimizerSettings> settings = ResolveRule(config);
  if (!settings.ok()) return settings;
  settings->decay_rate = config.decay_rate();
  settings->decay_steps = config.decay_steps();
  return settings;
}

}  // namespace pst
