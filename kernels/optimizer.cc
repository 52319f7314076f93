#include "kernels/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pst {
namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  std::string Name() const override { return "sgd"; }
  int SlotsPerParameter() const override { return 0; }
  void Apply(int64_t, float lr_scale, std::span<float> param, std::span<const float> grad,
             std::span<float>) const override {
    const float lr = lr_ * lr_scale;
    float* __restrict p = param.data();
    const float* __restrict g = grad.data();
    for (size_t i = 0; i < param.size(); ++i) p[i] -= lr * g[i];
  }

 private:
  float lr_;
};

// v = m v + g;  classic: p -= lr v;  Nesterov: p -= lr (g + m v).
class Momentum final : public Optimizer {
 public:
  Momentum(float lr, float momentum, bool nesterov)
      : lr_(lr), momentum_(momentum), nesterov_(nesterov) {}
  std::string Name() const override { return nesterov_ ? "nesterov" : "momentum"; }
  int SlotsPerParameter() const override { return 1; }
  void Apply(int64_t, float lr_scale, std::span<float> param, std::span<const float> grad,
             std::span<float> slots) const override {
    const float lr = lr_ * lr_scale;
    const float m = momentum_;
    float* __restrict p = param.data();
    const float* __restrict g = grad.data();
    float* __restrict v = slots.data();
    if (nesterov_) {
      for (size_t i = 0; i < param.size(); ++i) {
        v[i] = m * v[i] + g[i];
        p[i] -= lr * (g[i] + m * v[i]);
      }
    } else {
      for (size_t i = 0; i < param.size(); ++i) {
        v[i] = m * v[i] + g[i];
        p[i] -= lr * v[i];
      }
    }
  }

 private:
  float lr_, momentum_;
  bool nesterov_;
};

// m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// p -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)   (Kingma & Ba, sec. 2)
class Adam final : public Optimizer {
 public:
  Adam(float lr, float beta1, float beta2, float epsilon)
      : lr_(lr), beta1_(beta1), beta2_(beta2), epsilon_(epsilon) {}
  std::string Name() const override { return "adam"; }
  int SlotsPerParameter() const override { return 2; }
  void Apply(int64_t step, float lr_scale, std::span<float> param, std::span<const float> grad,
             std::span<float> slots) const override {
    const size_t n = param.size();
    const double t = static_cast<double>(step);
    const float alpha = static_cast<float>(lr_ * lr_scale * std::sqrt(1.0 - std::pow(beta2_, t)) /
                                           (1.0 - std::pow(beta1_, t)));
    const float b1 = beta1_, b2 = beta2_, eps = epsilon_;
    float* __restrict p = param.data();
    const float* __restrict g = grad.data();
    float* __restrict m = slots.data();
    float* __restrict v = slots.data() + n;
    for (size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= alpha * m[i] / (std::sqrt(v[i]) + eps);
    }
  }

 private:
  float lr_, beta1_, beta2_, epsilon_;
};

// acc += g^2;  p -= lr g / (sqrt(acc) + eps).
class Adagrad final : public Optimizer {
 public:
  Adagrad(float lr, float initial, float epsilon) : lr_(lr), initial_(initial), epsilon_(epsilon) {}
  std::string Name() const override { return "adagrad"; }
  int SlotsPerParameter() const override { return 1; }
  float InitialSlotValue() const override { return initial_; }
  void Apply(int64_t, float lr_scale, std::span<float> param, std::span<const float> grad,
             std::span<float> slots) const override {
    const float lr = lr_ * lr_scale;
    const float eps = epsilon_;
    float* __restrict p = param.data();
    const float* __restrict g = grad.data();
    float* __restrict acc = slots.data();
    for (size_t i = 0; i < param.size(); ++i) {
      acc[i] += g[i] * g[i];
      p[i] -= lr * g[i] / (std::sqrt(acc[i]) + eps);
    }
  }

 private:
  float lr_, initial_, epsilon_;
};

absl::Status CheckLearningRate(float lr, const char* optimizer) {
  if (!std::isfinite(lr) || lr <= 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        optimizer, " learning_rate must be a positive number, got ", lr));
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

}  // namespace

float Optimizer::DecayFactor(int64_t step) const {
  if (decay_steps_ <= 0) return 1.0f;
  return static_cast<float>(
      std::pow(static_cast<double>(decay_rate_), static_cast<double>(step) / decay_steps_));
}

namespace {

absl::StatusOr<std::unique_ptr<Optimizer>> MakeUpdateRule(const OptimizerConfig& config) {
  switch (config.kind_case()) {
    case OptimizerConfig::kSgd: {
      const SgdConfig& c = config.sgd();
      if (absl::Status s = CheckLearningRate(c.learning_rate(), "sgd"); !s.ok()) return s;
      if (absl::Status s = CheckUnitInterval(c.momentum(), "sgd momentum"); !s.ok()) return s;
      if (c.momentum() == 0.0f && !c.nesterov()) {
        return std::unique_ptr<Optimizer>(new Sgd(c.learning_rate()));
      }
      return std::unique_ptr<Optimizer>(new Momentum(c.learning_rate(), c.momentum(), c.nesterov()));
    }
    case OptimizerConfig::kAdam: {
      const AdamConfig& c = config.adam();
      float beta1 = OrDefault(c.beta1(), 0.9f), beta2 = OrDefault(c.beta2(), 0.999f);
      float epsilon = OrDefault(c.epsilon(), 1e-8f);
      if (absl::Status s = CheckLearningRate(c.learning_rate(), "adam"); !s.ok()) return s;
      if (absl::Status s = CheckUnitInterval(beta1, "adam beta1"); !s.ok()) return s;
      if (absl::Status s = CheckUnitInterval(beta2, "adam beta2"); !s.ok()) return s;
      if (!(epsilon > 0.0f)) return absl::InvalidArgumentError("adam epsilon must be positive");
      return std::unique_ptr<Optimizer>(new Adam(c.learning_rate(), beta1, beta2, epsilon));
    }
    case OptimizerConfig::kAdagrad: {
      const AdagradConfig& c = config.adagrad();
      float initial = OrDefault(c.initial_accumulator(), 0.1f);
      float epsilon = OrDefault(c.epsilon(), 1e-7f);
      if (absl::Status s = CheckLearningRate(c.learning_rate(), "adagrad"); !s.ok()) return s;
      if (!(initial >= 0.0f) || !(epsilon > 0.0f)) {
        return absl::InvalidArgumentError(
            "adagrad initial_accumulator must be >= 0 and epsilon positive");
      }
      return std::unique_ptr<Optimizer>(new Adagrad(c.learning_rate(), initial, epsilon));
    }
    case OptimizerConfig::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("no optimizer configured; set sgd, adam or adagrad");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config) {
  if (config.decay_steps() < 0 ||
      (config.decay_steps() > 0 && !(config.decay_rate() > 0.0f && config.decay_rate() <= 1.0f))) {
    return absl::InvalidArgumentError(
        "learning-rate decay needs decay_steps >= 0 and decay_rate in (0, 1]");
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = MakeUpdateRule(config);
  if (!optimizer.ok()) return optimizer;
  (*optimizer)->decay_rate_ = config.decay_rate();
  (*optimizer)->decay_steps_ = config.decay_steps();
  return optimizer;
}

}  // namespace pst
