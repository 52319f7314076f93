// The optimizer a config names: the documented defaults, and what is refused.
#include "common/optimizer_config.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using Rule = OptimizerSettings::Rule;

TEST(OptimizerConfigTest, SgdIsPlainMomentumOrNesterov) {
  struct Case {
    std::string name;
    float momentum;
    bool nesterov;
    Rule rule;
  };
  const std::vector<Case> cases = {
      {"plain", 0.0f, false, Rule::kSgd},
      {"momentum", 0.9f, false, Rule::kMomentum},
      {"nesterov", 0.9f, true, Rule::kNesterov},
      {"nesterov without momentum", 0.0f, true, Rule::kNesterov},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    OptimizerConfig config;
    config.mutable_sgd()->set_learning_rate(0.1f);
    config.mutable_sgd()->set_momentum(c.momentum);
    config.mutable_sgd()->set_nesterov(c.nesterov);
    absl::StatusOr<OptimizerSettings> settings = ResolveOptimizerConfig(config);
    ASSERT_TRUE(settings.ok()) << settings.status();
    EXPECT_EQ(settings->rule, c.rule);
    EXPECT_FLOAT_EQ(settings->learning_rate, 0.1f);
    EXPECT_FLOAT_EQ(settings->momentum, c.momentum);
  }
}

TEST(OptimizerConfigTest, UnsetHyperparametersTakeTheDocumentedDefaults) {
  OptimizerConfig adam;
  adam.mutable_adam()->set_learning_rate(0.01f);
  absl::StatusOr<OptimizerSettings> a = ResolveOptimizerConfig(adam);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rule, Rule::kAdam);
  EXPECT_FLOAT_EQ(a->beta1, 0.9f);
  EXPECT_FLOAT_EQ(a->beta2, 0.999f);
  EXPECT_FLOAT_EQ(a->epsilon, 1e-8f);
  EXPECT_EQ(a->decay_steps, 0);

  OptimizerConfig adagrad;
  adagrad.mutable_adagrad()->set_learning_rate(0.01f);
  adagrad.set_decay_rate(0.5f);
  adagrad.set_decay_steps(100);
  absl::StatusOr<OptimizerSettings> g = ResolveOptimizerConfig(adagrad);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rule, Rule::kAdagrad);
  EXPECT_FLOAT_EQ(g->initial_accumulator, 0.1f);
  EXPECT_FLOAT_EQ(g->epsilon, 1e-7f);
  EXPECT_FLOAT_EQ(g->decay_rate, 0.5f);
  EXPECT_EQ(g->decay_steps, 100);
}

TEST(OptimizerConfigTest, OutOfRangeIsInvalidArgumentNamingTheField) {
  struct Case {
    std::string name;
    OptimizerConfig config;
    std::string message;
  };
  std::vector<Case> cases(6);
  cases[0] = {"nothing set", {}, "no optimizer configured"};
  cases[1].name = "zero learning rate";
  cases[1].config.mutable_sgd()->set_learning_rate(0);
  cases[1].message = "sgd learning_rate must be a positive number";
  cases[2].name = "momentum of one";
  cases[2].config.mutable_sgd()->set_learning_rate(0.1f);
  cases[2].config.mutable_sgd()->set_momentum(1.0f);
  cases[2].message = "sgd momentum must be in [0, 1)";
  cases[3].name = "beta2 above one";
  cases[3].config.mutable_adam()->set_learning_rate(0.1f);
  cases[3].config.mutable_adam()->set_beta2(1.5f);
  cases[3].message = "adam beta2 must be in [0, 1)";
  cases[4].name = "negative adagrad epsilon";
  cases[4].config.mutable_adagrad()->set_learning_rate(0.1f);
  cases[4].config.mutable_adagrad()->set_epsilon(-1.0f);
  cases[4].message = "epsilon positive";
  cases[5].name = "decay rate above one";
  cases[5].config.mutable_sgd()->set_learning_rate(0.1f);
  cases[5].config.set_decay_rate(1.5f);
  cases[5].config.set_decay_steps(10);
  cases[5].message = "decay_rate in (0, 1]";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<OptimizerSettings> settings = ResolveOptimizerConfig(c.config);
    EXPECT_EQ(settings.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(settings.status().message()), HasSubstr(c.message));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
