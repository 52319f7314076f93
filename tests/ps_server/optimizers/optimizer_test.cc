// Optimizer update rules against values worked out by hand.
#include "ps_server/optimizers/optimizer.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

std::unique_ptr<Optimizer> Make(const std::string& text_kind, float lr, float momentum = 0,
                                bool nesterov = false) {
  OptimizerConfig config;
  if (text_kind == "sgd") {
    config.mutable_sgd()->set_learning_rate(lr);
    config.mutable_sgd()->set_momentum(momentum);
    config.mutable_sgd()->set_nesterov(nesterov);
  } else if (text_kind == "adam") {
    config.mutable_adam()->set_learning_rate(lr);
  } else if (text_kind == "adamw") {
    config.mutable_adamw()->set_learning_rate(lr);
  } else if (text_kind == "ftrl") {
    config.mutable_ftrl()->set_learning_rate(lr);
    config.mutable_ftrl()->set_l1(0.05f);
    config.mutable_ftrl()->set_l2(0.5f);
  } else {
    config.mutable_adagrad()->set_learning_rate(lr);
  }
  auto optimizer = MakeOptimizer(config);
  EXPECT_TRUE(optimizer.ok()) << optimizer.status();
  return std::move(*optimizer);
}

// Runs `steps` updates of a one-element parameter with the given gradients.
std::vector<float> Trajectory(const Optimizer& opt, float start, std::vector<float> grads) {
  std::vector<float> param = {start};
  std::vector<float> slots(opt.SlotsPerParameter(), opt.InitialSlotValue());
  std::vector<float> out;
  for (size_t t = 0; t < grads.size(); ++t) {
    opt.Apply(static_cast<int64_t>(t + 1), 1.0f, param, std::span<const float>(&grads[t], 1), slots);
    out.push_back(param[0]);
  }
  return out;
}

TEST(OptimizerTest, PlainSgd) {
  auto opt = Make("sgd", 0.1f);
  EXPECT_EQ(opt->Name(), "sgd");
  EXPECT_EQ(opt->SlotsPerParameter(), 0);
  // 1 - 0.1*2 = 0.8; 0.8 - 0.1*(-1) = 0.9
  EXPECT_THAT(Trajectory(*opt, 1.0f, {2, -1}),
              ::testing::ElementsAre(::testing::FloatEq(0.8f), ::testing::FloatEq(0.9f)));
}

TEST(OptimizerTest, LearningRateScaleMultipliesTheStep) {
  auto opt = Make("sgd", 0.1f);
  std::vector<float> p = {1.0f}, g = {2.0f}, slots;
  opt->Apply(1, 0.5f, p, g, slots);
  EXPECT_FLOAT_EQ(p[0], 0.9f);
}

TEST(OptimizerTest, Momentum) {
  auto opt = Make("sgd", 0.1f, 0.9f);
  EXPECT_EQ(opt->Name(), "momentum");
  // v1 = 1, p = 1 - 0.1 = 0.9; v2 = 0.9 + 1 = 1.9, p = 0.9 - 0.19 = 0.71;
  // v3 = 1.71 + 0 = 1.71, p = 0.71 - 0.171 = 0.539
  EXPECT_THAT(Trajectory(*opt, 1.0f, {1, 1, 0}),
              ::testing::ElementsAre(::testing::FloatEq(0.9f), ::testing::FloatEq(0.71f),
                                     ::testing::FloatEq(0.539f)));
}

TEST(OptimizerTest, Nesterov) {
  auto opt = Make("sgd", 0.1f, 0.9f, true);
  EXPECT_EQ(opt->Name(), "nesterov");
  // v1 = 1, p = 1 - 0.1 (1 + 0.9) = 0.81; v2 = 1.9, p = 0.81 - 0.1 (1 + 1.71) = 0.539
  EXPECT_THAT(Trajectory(*opt, 1.0f, {1, 1}),
              ::testing::ElementsAre(::testing::FloatEq(0.81f), ::testing::FloatEq(0.539f)));
}

TEST(OptimizerTest, AdamWithBiasCorrection) {
  auto opt = Make("adam", 0.1f);
  EXPECT_EQ(opt->SlotsPerParameter(), 2);
  // Step 1, g = 2: m = 0.2, v = 0.004; corrected m/sqrt(v) = 2/2 = 1 -> p = 1 - 0.1.
  // Step 2, g = -1: m = 0.18 - 0.1 = 0.08, v = 0.003996 + 0.001 = 0.004996;
  // m_hat = 0.08/0.19, v_hat = 0.004996/0.001999; step = 0.1 * m_hat / sqrt(v_hat).
  const double m_hat = 0.08 / 0.19, v_hat = 0.004996 / (1 - 0.999 * 0.999);
  const double second = 0.9 - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
  std::vector<float> t = Trajectory(*opt, 1.0f, {2, -1});
  EXPECT_NEAR(t[0], 0.9, 1e-6);
  EXPECT_NEAR(t[1], second, 1e-6);
}

// torch.optim.AdamW's update, worked out in double.
TEST(OptimizerTest, AdamWDecaysThenStepsAsTorchDoes) {
  OptimizerConfig config;
  config.mutable_adamw()->set_learning_rate(0.1f);
  config.mutable_adamw()->set_weight_decay(0.5f);
  auto opt = MakeOptimizer(config);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ((*opt)->Name(), "adamw");
  std::vector<float> p = {1.0f, -2.0f}, slots(4, 0.0f);
  double ref_p[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  const float grads[3][2] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-0.75f, 0.125f}};
  for (int t = 1; t <= 3; ++t) {
    (*opt)->Apply(t, 1.0f, p, grads[t - 1], slots);
    for (int i = 0; i < 2; ++i) {
      const double g = grads[t - 1][i];
      ref_p[i] *= 1.0 - 0.1 * 0.5;
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      ref_p[i] -= 0.1 / (1 - std::pow(0.9, t)) * m[i] /
                  (std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.999, t)) + 1e-8);
      EXPECT_NEAR(p[i], ref_p[i], 1e-6) << "step " << t << " element " << i;
    }
  }
}

TEST(OptimizerTest, AStepsOwnRatesReplaceTheConfiguredOnes) {
  OptimizerConfig config;
  config.mutable_adamw()->set_learning_rate(0.1f);  // weight decay: 0.01 by default
  auto opt = MakeOptimizer(config);
  ASSERT_TRUE(opt.ok()) << opt.status();
  // A rate of 0 (a warmup's first step) leaves the value as it was.
  std::vector<float> p = {3.0f}, slots(2, 0.0f);
  Optimizer::Step step;
  step.learning_rate = 0.0f;
  (*opt)->Apply(step, p, std::vector<float>{1.0f}, slots);
  EXPECT_EQ(p[0], 3.0f);
  // Decay alone: a zero gradient, lr 0.2 and weight decay 0.5.
  std::vector<float> q = {2.0f}, fresh(2, 0.0f);
  step.learning_rate = 0.2f;
  step.weight_decay = 0.5f;
  (*opt)->Apply(step, q, std::vector<float>{0.0f}, fresh);
  EXPECT_FLOAT_EQ(q[0], 2.0f * (1.0f - 0.2f * 0.5f));
  // SGD's rate scaled by lr_scale, as the configured one is.
  auto sgd = Make("sgd", 1.0f);
  std::vector<float> r = {1.0f}, none;
  Optimizer::Step scaled;
  scaled.learning_rate = 0.5f;
  scaled.lr_scale = 0.5f;
  sgd->Apply(scaled, r, std::vector<float>{2.0f}, none);
  EXPECT_FLOAT_EQ(r[0], 1.0f - 0.25f * 2.0f);
}

TEST(OptimizerTest, AdagradStartsFromItsInitialAccumulator) {
  auto opt = Make("adagrad", 0.5f);
  EXPECT_FLOAT_EQ(opt->InitialSlotValue(), 0.1f);
  // acc = 0.1 + 4 = 4.1, p = 1 - 0.5 * 2 / sqrt(4.1); then acc = 5.1, g = 1.
  const double first = 1 - 0.5 * 2 / (std::sqrt(4.1) + 1e-7);
  const double second = first - 0.5 * 1 / (std::sqrt(5.1) + 1e-7);
  std::vector<float> t = Trajectory(*opt, 1.0f, {2, 1});
  EXPECT_NEAR(t[0], first, 1e-6);
  EXPECT_NEAR(t[1], second, 1e-6);
}

TEST(OptimizerTest, FtrlKeepsAWeightAtZeroUntilItsSignalPassesL1) {
  auto opt = Make("ftrl", 1.0f);  // beta 1 (its default), l1 0.05, l2 0.5
  EXPECT_EQ(opt->Name(), "ftrl");
  EXPECT_EQ(opt->SlotsPerParameter(), 2);
  EXPECT_EQ(opt->InitialSlotValue(), 0.0f);
  // g = 0.04: n = 0.0016, sigma = 0.04, z = 0.04 - 0.04 * 0 <= l1: w = 0.
  // g = 0.03: n = 0.0025, sigma = 0.01, z = 0.07:
  //   w = -(0.07 - 0.05) / ((1 + 0.05) / 1 + 0.5) = -0.02 / 1.55.
  std::vector<float> t = Trajectory(*opt, 0.0f, {0.04f, 0.03f});
  EXPECT_EQ(t[0], 0.0f);
  EXPECT_NEAR(t[1], -0.02 / 1.55, 1e-7);
  // A weight that starts away from 0 is pulled by sigma w into z, and its
  // first update with a small gradient sets it to exactly 0.
  EXPECT_EQ(Trajectory(*opt, 0.5f, {0.01f})[0], 0.0f);
}

TEST(OptimizerTest, ExponentialDecayShrinksTheStep) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(1.0f);
  config.set_decay_rate(0.5f);
  config.set_decay_steps(10);
  auto opt = MakeOptimizer(config);
  ASSERT_TRUE(opt.ok());
  EXPECT_FLOAT_EQ((*opt)->DecayFactor(0), 1.0f);
  EXPECT_FLOAT_EQ((*opt)->DecayFactor(10), 0.5f);
  EXPECT_FLOAT_EQ((*opt)->DecayFactor(20), 0.25f);
  EXPECT_FLOAT_EQ((*opt)->DecayFactor(5), std::sqrt(0.5f));
  auto plain = Make("sgd", 1.0f);
  EXPECT_FLOAT_EQ(plain->DecayFactor(1000), 1.0f);
  config.set_decay_rate(1.5f);
  EXPECT_EQ(MakeOptimizer(config).status().code(), absl::StatusCode::kInvalidArgument);
}

// Range's contract: an element's result depends only on its own inputs,
// so one call over a long range (the vectorized loop and its remainder),
// in place or not, is bitwise one call per element.
TEST(OptimizerTest, ALongRangeIsBitwiseOneElementAtATime) {
  constexpr size_t kCount = 1027;
  for (const std::string kind : {"sgd", "momentum", "adam", "adamw", "adagrad", "ftrl"}) {
    SCOPED_TRACE(kind);
    auto opt = Make(kind == "momentum" ? "sgd" : kind, 0.01f, kind == "momentum" ? 0.9f : 0.0f);
    const int slots = opt->SlotsPerParameter();
    std::vector<float> param(kCount), grad(kCount), state(slots * kCount);
    for (size_t i = 0; i < kCount; ++i) {
      param[i] = std::sin(0.1f * i);
      grad[i] = std::cos(0.37f * i) * 3;
      for (int s = 0; s < slots; ++s) state[s * kCount + i] = 0.01f * ((i + s) % 17);
    }
    std::vector<float> whole_param(kCount), whole_state(state.size());
    opt->ApplyRange(3, 1.0f,
                    {.count = kCount, .param = param.data(), .grad = grad.data(),
                     .slots = state.data(), .param_out = whole_param.data(),
                     .slots_out = whole_state.data(), .slot_stride = kCount});
    std::vector<float> in_place_param = param, in_place_state = state;
    opt->ApplyRange(3, 1.0f,
                    {.count = kCount, .param = in_place_param.data(), .grad = grad.data(),
                     .slots = in_place_state.data(), .param_out = in_place_param.data(),
                     .slots_out = in_place_state.data(), .slot_stride = kCount});
    std::vector<float> one_param(kCount), one_state(state.size());
    // Plain SGD has no slots: its empty vectors' data() may be null, and
    // null plus an offset is undefined (clang's UBSan reports it).
    auto slot_at = [&](std::vector<float>& slots_of, size_t i) {
      return slots > 0 ? slots_of.data() + i : nullptr;
    };
    for (size_t i = 0; i < kCount; ++i) {
      opt->ApplyRange(3, 1.0f,
                      {.count = 1,
                       .param = &param[i],
                       .grad = &grad[i],
                       .slots = slot_at(state, i),
                       .param_out = &one_param[i],
                       .slots_out = slot_at(one_state, i),
                       .slot_stride = kCount});
    }
    EXPECT_EQ(whole_param, one_param);
    EXPECT_EQ(whole_state, one_state);
    EXPECT_EQ(in_place_param, one_param);
    EXPECT_EQ(in_place_state, one_state);
  }
}

TEST(OptimizerTest, BadConfigsAreInvalidArguments) {
  struct Case {
    std::string name;
    OptimizerConfig config;
  };
  std::vector<Case> cases(10);
  cases[0].name = "nothing set";
  cases[1].name = "zero learning rate";
  cases[1].config.mutable_sgd()->set_learning_rate(0);
  cases[2].name = "negative learning rate";
  cases[2].config.mutable_adam()->set_learning_rate(-1);
  cases[3].name = "momentum of one";
  cases[3].config.mutable_sgd()->set_learning_rate(0.1f);
  cases[3].config.mutable_sgd()->set_momentum(1.0f);
  cases[4].name = "beta2 above one";
  cases[4].config.mutable_adam()->set_learning_rate(0.1f);
  cases[4].config.mutable_adam()->set_beta2(1.5f);
  cases[5].name = "negative ftrl l2";
  cases[5].config.mutable_ftrl()->set_learning_rate(0.1f);
  cases[5].config.mutable_ftrl()->set_l2(-1.0f);
  cases[6].name = "infinite ftrl beta";
  cases[6].config.mutable_ftrl()->set_learning_rate(0.1f);
  cases[6].config.mutable_ftrl()->set_beta(INFINITY);
  cases[7].name = "negative adamw weight decay";
  cases[7].config.mutable_adamw()->set_learning_rate(0.1f);
  cases[7].config.mutable_adamw()->set_weight_decay(-0.1f);
  cases[8].name = "negative clip norm";
  cases[8].config.mutable_sgd()->set_learning_rate(0.1f);
  cases[8].config.set_clip_norm(-1.0f);
  cases[9].name = "infinite clip norm";
  cases[9].config.mutable_sgd()->set_learning_rate(0.1f);
  cases[9].config.set_clip_norm(INFINITY);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(MakeOptimizer(c.config).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
