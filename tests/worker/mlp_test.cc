// Mlp gradients against central finite differences of its own loss.
#include "worker/mlp.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace {

struct Problem {
  std::string name;
  MlpSpec spec;
};

std::vector<float> Random(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double LossAt(Mlp& mlp, const std::vector<float>& x, const std::vector<float>& y, int batch) {
  EXPECT_TRUE(mlp.UploadParameters().ok());
  absl::StatusOr<LossResult> loss = mlp.Evaluate(x.data(), y.data(), batch);
  EXPECT_TRUE(loss.ok());
  return loss->loss;
}

TEST(MlpTest, GradientsMatchFiniteDifferences) {
  std::vector<Problem> problems = {
      {"relu classifier 5-4-3-3",
       {5, {4, 3}, 3, ActivationKind::kRelu, LossKind::kSoftmaxCrossEntropy, true}},
      {"tanh classifier 5-6-4", {5, {6}, 4, ActivationKind::kTanh, LossKind::kSoftmaxCrossEntropy, true}},
      {"tanh regression 3-5-2", {3, {5}, 2, ActivationKind::kTanh, LossKind::kMeanSquaredError, true}},
      {"linear model without bias", {3, {}, 1, ActivationKind::kRelu, LossKind::kMeanSquaredError, false}},
  };
  constexpr int kBatch = 6;
  for (const Problem& p : problems) {
    SCOPED_TRACE(p.name);
    std::unique_ptr<Kernels> kernels = MakeCpuKernels();
    absl::StatusOr<std::unique_ptr<Mlp>> created = Mlp::Create(p.spec, kernels.get(), kBatch);
    ASSERT_TRUE(created.ok()) << created.status();
    Mlp& mlp = **created;
    std::vector<std::vector<float>> init = mlp.InitialValues(3);
    for (size_t v = 0; v < init.size(); ++v) {
      std::vector<float> noise = Random(init[v].size(), 10 + v, -0.3f, 0.3f);  // nonzero biases too
      for (size_t i = 0; i < init[v].size(); ++i) mlp.HostParameter(v)[i] = init[v][i] + noise[i];
    }
    std::vector<float> x = Random(static_cast<size_t>(kBatch) * p.spec.input_dim, 1, -1, 1);
    std::vector<float> y;
    if (p.spec.loss == LossKind::kSoftmaxCrossEntropy) {
      for (int r = 0; r < kBatch; ++r) y.push_back(static_cast<float>(r % p.spec.output_dim));
    } else {
      y = Random(static_cast<size_t>(kBatch) * p.spec.output_dim, 2, -1, 1);
    }
    ASSERT_TRUE(mlp.UploadParameters().ok());
    ASSERT_TRUE(mlp.ComputeGradients(x.data(), y.data(), kBatch).ok());
    std::vector<std::vector<float>> analytic;
    for (size_t v = 0; v < mlp.variables().size(); ++v) {
      analytic.emplace_back(mlp.HostGradient(v).begin(), mlp.HostGradient(v).end());
    }
    for (size_t v = 0; v < mlp.variables().size(); ++v) {
      SCOPED_TRACE(mlp.variables()[v].name);
      std::span<float> param = mlp.HostParameter(v);
      for (size_t i = 0; i < param.size(); ++i) {
        // Small enough that no ReLU pre-activation of this problem crosses zero;
        // float rounding of the loss then costs about 1e-3 of absolute error.
        constexpr float kEps = 1e-4f;
        const float saved = param[i];
        param[i] = saved + kEps;
        const double plus = LossAt(mlp, x, y, kBatch);
        param[i] = saved - kEps;
        const double minus = LossAt(mlp, x, y, kBatch);
        param[i] = saved;
        const double numeric = (plus - minus) / (2 * kEps);
        EXPECT_NEAR(analytic[v][i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << "element " << i;
      }
    }
  }
}

TEST(MlpTest, VariablesAreNamedAndShapedPerLayer) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  auto mlp = Mlp::Create({784, {256, 128}, 10}, kernels.get(), 64);
  ASSERT_TRUE(mlp.ok());
  std::vector<std::string> names;
  for (const VariableSpec& v : (*mlp)->variables()) names.push_back(v.name);
  EXPECT_THAT(names, ::testing::ElementsAre("dense_0/kernel", "dense_0/bias", "dense_1/kernel",
                                            "dense_1/bias", "dense_2/kernel", "dense_2/bias"));
  EXPECT_EQ((*mlp)->num_parameters(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ((*mlp)->InitialValues(7), (*mlp)->InitialValues(7));
  EXPECT_NE((*mlp)->InitialValues(7), (*mlp)->InitialValues(8));
}

TEST(MlpTest, GradientDescentLowersTheLoss) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  auto created = Mlp::Create({2, {8}, 2, ActivationKind::kTanh}, kernels.get(), 4);
  ASSERT_TRUE(created.ok());
  Mlp& mlp = **created;
  std::vector<std::vector<float>> init = mlp.InitialValues(1);
  for (size_t v = 0; v < init.size(); ++v) std::copy(init[v].begin(), init[v].end(), mlp.HostParameter(v).begin());
  std::vector<float> x = {1, 1, -1, -1, 1, -1, -1, 1}, y = {0, 0, 1, 1};
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    ASSERT_TRUE(mlp.UploadParameters().ok());
    absl::StatusOr<LossResult> loss = mlp.ComputeGradients(x.data(), y.data(), 4);
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = loss->loss;
    last = loss->loss;
    for (size_t v = 0; v < init.size(); ++v) {
      for (size_t i = 0; i < init[v].size(); ++i) mlp.HostParameter(v)[i] -= 0.5f * mlp.HostGradient(v)[i];
    }
  }
  EXPECT_LT(last, first * 0.1);
}

TEST(MlpTest, BadSpecsAndBatchesAreRefused) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  EXPECT_EQ(Mlp::Create({0, {}, 2}, kernels.get(), 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({3, {0}, 2}, kernels.get(), 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mlp::Create({3, {}, 1}, kernels.get(), 4).status().code(), absl::StatusCode::kInvalidArgument);
  auto mlp = Mlp::Create({1, {}, 2}, kernels.get(), 4);
  ASSERT_TRUE(mlp.ok());
  std::vector<float> x(5), y(5);
  EXPECT_EQ((*mlp)->ComputeGradients(x.data(), y.data(), 5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pst
