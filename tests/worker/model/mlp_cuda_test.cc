// A whole Mlp forward + backward on the CUDA backend against the same Mlp on
// the CPU reference: same parameters, same batch, loss and every gradient
// within 1e-5 relative error (fp32, no TF32). Runs, skips or fails as
// tests/support/gpu_check.h decides.
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/support/gpu_check.h"
#include "worker/model/mlp.h"

namespace pst {
namespace PST_FILE_ID {

constexpr double kTolerance = 1e-5;

std::vector<float> Random(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

struct Case {
  std::string name;
  MlpSpec spec;
  int batch;
};

// One model on one backend, with the parameters every backend gets.
std::unique_ptr<Mlp> MakeModel(const Case& c, Kernels* kernels) {
  absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(c.spec, kernels, c.batch);
  EXPECT_TRUE(mlp.ok()) << mlp.status();
  if (!mlp.ok()) return nullptr;
  std::vector<std::vector<float>> init = (*mlp)->InitialValues(7);
  for (size_t v = 0; v < init.size(); ++v) {
    std::vector<float> noise = Random(init[v].size(), 100 + v, -0.05f, 0.05f);  // nonzero biases
    for (size_t i = 0; i < init[v].size(); ++i) (*mlp)->HostParameter(v)[i] = init[v][i] + noise[i];
  }
  EXPECT_TRUE((*mlp)->UploadParameters().ok());
  return std::move(*mlp);
}

TEST(MlpCudaTest, ForwardAndBackwardMatchTheCpu) {
  PST_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<Kernels>> gpu = MakeCudaKernels(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  const std::vector<Case> cases = {
      {"relu 784-256-128-10", {784, {256, 128}, 10, ActivationKind::kRelu,
                               LossKind::kSoftmaxCrossEntropy, true}, 64},
      {"tanh 784-1024-1024-10", {784, {1024, 1024}, 10, ActivationKind::kTanh,
                                 LossKind::kSoftmaxCrossEntropy, true}, 256},
      {"relu regression 13-64-3 without bias", {13, {64}, 3, ActivationKind::kRelu,
                                                LossKind::kMeanSquaredError, false}, 100},
      {"linear classifier 50-7", {50, {}, 7, ActivationKind::kRelu,
                                  LossKind::kSoftmaxCrossEntropy, true}, 33},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Mlp> on_cpu = MakeModel(c, cpu.get());
    std::unique_ptr<Mlp> on_gpu = MakeModel(c, gpu->get());
    ASSERT_TRUE(on_cpu && on_gpu);
    std::vector<float> x = Random(static_cast<size_t>(c.batch) * c.spec.input_dim, 1, 0.0f, 1.0f);
    std::vector<float> y;
    if (c.spec.loss == LossKind::kSoftmaxCrossEntropy) {
      std::mt19937 rng(2);
      for (int r = 0; r < c.batch; ++r) y.push_back(static_cast<float>(rng() % c.spec.output_dim));
    } else {
      y = Random(static_cast<size_t>(c.batch) * c.spec.output_dim, 2, -1, 1);
    }
    absl::StatusOr<LossResult> expected = on_cpu->ComputeGradients(x.data(), y.data(), c.batch);
    absl::StatusOr<LossResult> actual = on_gpu->ComputeGradients(x.data(), y.data(), c.batch);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, kTolerance * std::abs(expected->loss));
    EXPECT_EQ(actual->correct, expected->correct);
    for (size_t v = 0; v < on_cpu->variables().size(); ++v) {
      SCOPED_TRACE(on_cpu->variables()[v].name);
      EXPECT_LE(RelativeError(on_gpu->HostGradient(v), on_cpu->HostGradient(v)), kTolerance);
    }
    absl::StatusOr<std::vector<float>> out_cpu = on_cpu->LastOutput(c.batch);
    absl::StatusOr<std::vector<float>> out_gpu = on_gpu->LastOutput(c.batch);
    ASSERT_TRUE(out_cpu.ok() && out_gpu.ok());
    EXPECT_LE(RelativeError(*out_gpu, *out_cpu), kTolerance);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
