#include "ps_server/optimizers/optimizer.h"

#include <cmath>

namespace pst {
namespace {

// The learning rate of `step` under a rule configured with `configured`.
float LearningRate(const Optimizer::Step& step, float configured) {
  return step.learning_rate.value_or(configured) * step.lr_scale;
}

// The update loops are compiled with -fno-math-errno (ps_server/CMakeLists.txt),
// so sqrt is one instruction and every loop vectorizes. Inputs and outputs
// are distinct in the hot path (the PS stages into fresh buffers), so the
// compiler's alias check selects the vector loop.

class Sgd final : public Optimizer {
 public:
  explicit Sgd(float lr) : lr_(lr) {}
  std::string Name() const override { return "sgd"; }
  int SlotsPerParameter() const override { return 0; }
  void ApplyRange(const Step& step, const Range& r) const override {
    const float lr = LearningRate(step, lr_);
    const float* p = r.param;
    const float* g = r.grad;
    float* out = r.param_out;
    for (size_t i = 0; i < r.count; ++i) out[i] = p[i] - lr * g[i];
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
  void ApplyRange(const Step& step, const Range& r) const override {
    const float lr = LearningRate(step, lr_);
    const float m = momentum_;
    const float* p = r.param;
    const float* g = r.grad;
    const float* v = r.slots;
    float* p_out = r.param_out;
    float* v_out = r.slots_out;
    if (nesterov_) {
      for (size_t i = 0; i < r.count; ++i) {
        const float vi = m * v[i] + g[i];
        v_out[i] = vi;
        p_out[i] = p[i] - lr * (g[i] + m * vi);
      }
    } else {
      for (size_t i = 0; i < r.count; ++i) {
        const float vi = m * v[i] + g[i];
        v_out[i] = vi;
        p_out[i] = p[i] - lr * vi;
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
  void ApplyRange(const Step& step, const Range& r) const override {
    const double t = static_cast<double>(step.t);
    const float alpha = static_cast<float>(LearningRate(step, lr_) *
                                           std::sqrt(1.0 - std::pow(beta2_, t)) /
                                           (1.0 - std::pow(beta1_, t)));
    const float b1 = beta1_, b2 = beta2_, eps = epsilon_;
    const float* p = r.param;
    const float* g = r.grad;
    const float* m = r.slots;
    const float* v = r.slots + r.slot_stride;
    float* p_out = r.param_out;
    float* m_out = r.slots_out;
    float* v_out = r.slots_out + r.slot_stride;
    // Element i reads and writes only element i (Range's contract), so no
    // iteration depends on another: with three outputs and four inputs the
    // vectorizer needs more alias checks than it will version for, and
    // would otherwise leave this loop scalar.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
    for (size_t i = 0; i < r.count; ++i) {
      const float mi = b1 * m[i] + (1.0f - b1) * g[i];
      const float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      m_out[i] = mi;
      v_out[i] = vi;
      p_out[i] = p[i] - alpha * mi / (std::sqrt(vi) + eps);
    }
  }

 private:
  float lr_, beta1_, beta2_, epsilon_;
};

// torch.optim.AdamW's update (config.proto, AdamWConfig), operation for
// operation in float: p (1 - lr wd), then the step of size lr / (1-b1^t)
// on m / (sqrt(v) / sqrt(1-b2^t) + eps).
class AdamW final : public Optimizer {
 public:
  AdamW(float lr, float beta1, float beta2, float epsilon, float weight_decay)
      : lr_(lr), beta1_(beta1), beta2_(beta2), epsilon_(epsilon), weight_decay_(weight_decay) {}
  std::string Name() const override { return "adamw"; }
  int SlotsPerParameter() const override { return 2; }
  void ApplyRange(const Step& step, const Range& r) const override {
    const float lr = LearningRate(step, lr_);
    const float decay = 1.0f - lr * step.weight_decay.value_or(weight_decay_);
    const double t = static_cast<double>(step.t);
    const float step_size = static_cast<float>(lr / (1.0 - std::pow(beta1_, t)));
    const float root_correction = static_cast<float>(std::sqrt(1.0 - std::pow(beta2_, t)));
    const float b1 = beta1_, b2 = beta2_, eps = epsilon_;
    const float* p = r.param;
    const float* g = r.grad;
    const float* m = r.slots;
    const float* v = r.slots + r.slot_stride;
    float* p_out = r.param_out;
    float* m_out = r.slots_out;
    float* v_out = r.slots_out + r.slot_stride;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
    for (size_t i = 0; i < r.count; ++i) {
      const float mi = b1 * m[i] + (1.0f - b1) * g[i];
      const float vi = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      m_out[i] = mi;
      v_out[i] = vi;
      p_out[i] = p[i] * decay - step_size * (mi / (std::sqrt(vi) / root_correction + eps));
    }
  }

 private:
  float lr_, beta1_, beta2_, epsilon_, weight_decay_;
};

// acc += g^2;  p -= lr g / (sqrt(acc) + eps).
class Adagrad final : public Optimizer {
 public:
  Adagrad(float lr, float initial, float epsilon) : lr_(lr), initial_(initial), epsilon_(epsilon) {}
  std::string Name() const override { return "adagrad"; }
  int SlotsPerParameter() const override { return 1; }
  float InitialSlotValue() const override { return initial_; }
  void ApplyRange(const Step& step, const Range& r) const override {
    const float lr = LearningRate(step, lr_);
    const float eps = epsilon_;
    const float* p = r.param;
    const float* g = r.grad;
    const float* acc = r.slots;
    float* p_out = r.param_out;
    float* acc_out = r.slots_out;
    for (size_t i = 0; i < r.count; ++i) {
      const float a = acc[i] + g[i] * g[i];
      acc_out[i] = a;
      p_out[i] = p[i] - lr * g[i] / (std::sqrt(a) + eps);
    }
  }

 private:
  float lr_, initial_, epsilon_;
};

// FTRL-proximal (McMahan et al. 2013, Algorithm 1), per element:
//   n' = n + g^2;  sigma = (sqrt(n') - sqrt(n)) / alpha;  z' = z + g - sigma w;
//   w' = 0 if |z'| <= l1, else -(z' - sign(z') l1) / ((beta + sqrt(n')) / alpha + l2).
// Slot 0 is z, slot 1 the sum of g^2 (n less initial_accumulator), so
// every slot starts at 0 whatever initial_accumulator is.
class Ftrl final : public Optimizer {
 public:
  Ftrl(float alpha, float beta, float l1, float l2, float initial)
      : alpha_(alpha), beta_(beta), l1_(l1), l2_(l2), initial_(initial) {}
  std::string Name() const override { return "ftrl"; }
  int SlotsPerParameter() const override { return 2; }
  void ApplyRange(const Step& step, const Range& r) const override {
    const float alpha = LearningRate(step, alpha_);
    const float beta = beta_, l1 = l1_, l2 = l2_, initial = initial_;
    const float* p = r.param;
    const float* g = r.grad;
    const float* z = r.slots;
    const float* sum = r.slots + r.slot_stride;
    float* p_out = r.param_out;
    float* z_out = r.slots_out;
    float* sum_out = r.slots_out + r.slot_stride;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
    for (size_t i = 0; i < r.count; ++i) {
      const float sum_i = sum[i] + g[i] * g[i];
      const float root = std::sqrt(initial + sum_i);
      const float sigma = (root - std::sqrt(initial + sum[i])) / alpha;
      const float zi = z[i] + g[i] - sigma * p[i];
      const float shrunk = zi - std::copysign(l1, zi);
      z_out[i] = zi;
      sum_out[i] = sum_i;
      p_out[i] = std::fabs(zi) <= l1 ? 0.0f : -shrunk / ((beta + root) / alpha + l2);
    }
  }

 private:
  float alpha_, beta_, l1_, l2_, initial_;
};

}  // namespace

void Optimizer::Apply(const Step& step, std::span<float> param, std::span<const float> grad,
                      std::span<float> slots) const {
  ApplyRange(step,
             Range{.count = param.size(),
                   .param = param.data(),
                   .grad = grad.data(),
                   .slots = slots.data(),
                   .param_out = param.data(),
                   .slots_out = slots.data(),
                   .slot_stride = param.size()});
}

float Optimizer::DecayFactor(int64_t step) const {
  if (decay_steps_ <= 0) return 1.0f;
  return static_cast<float>(
      std::pow(static_cast<double>(decay_rate_), static_cast<double>(step) / decay_steps_));
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerSettings& s) {
  std::unique_ptr<Optimizer> optimizer;
  switch (s.rule) {
    case OptimizerSettings::Rule::kSgd:
      optimizer = std::make_unique<Sgd>(s.learning_rate);
      break;
    case OptimizerSettings::Rule::kMomentum:
    case OptimizerSettings::Rule::kNesterov:
      optimizer = std::make_unique<Momentum>(s.learning_rate, s.momentum,
                                             s.rule == OptimizerSettings::Rule::kNesterov);
      break;
    case OptimizerSettings::Rule::kAdam:
      optimizer = std::make_unique<Adam>(s.learning_rate, s.beta1, s.beta2, s.epsilon);
      break;
    case OptimizerSettings::Rule::kAdamW:
      optimizer = std::make_unique<AdamW>(s.learning_rate, s.beta1, s.beta2, s.epsilon,
                                          s.weight_decay);
      break;
    case OptimizerSettings::Rule::kAdagrad:
      optimizer = std::make_unique<Adagrad>(s.learning_rate, s.initial_accumulator, s.epsilon);
      break;
    case OptimizerSettings::Rule::kFtrl:
      optimizer =
          std::make_unique<Ftrl>(s.learning_rate, s.beta, s.l1, s.l2, s.initial_accumulator);
      break;
  }
  optimizer->decay_rate_ = s.decay_rate;
  optimizer->decay_steps_ = s.decay_steps;
  return optimizer;
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config) {
  absl::StatusOr<OptimizerSettings> settings = ResolveOptimizerConfig(config);
  if (!settings.ok()) return settings.status();
  return MakeOptimizer(*settings);
}

}  // namespace pst
