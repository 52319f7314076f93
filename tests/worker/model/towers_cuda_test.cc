// Towers on CUDA backends against one CPU model computing the whole batch:
// two GPU towers (on GPUs 0 and 1, or both on GPU 0 where there is one) of
// b/2 rows give the gradient of one device with b rows, to 1e-5. Runs, skips
// or fails as tests/support/gpu_check.h decides.
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/support/gpu_check.h"
#include "worker/model/towers.h"

namespace pst {
namespace PST_FILE_ID {

double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

TEST(TowersCudaTest, TwoGpuTowersGiveTheGradientOfOneCpuWithTheWholeBatch) {
  PST_REQUIRE_GPU();
  constexpr int kBatch = 64;
  MlpSpec spec;
  spec.input_dim = 784;
  spec.hidden = {256, 128};
  spec.output_dim = 10;
  spec.loss = LossKind::kSoftmaxCrossEntropy;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kBatch) * spec.input_dim), y;
  for (float& v : x) v = pixel(rng);
  for (int r = 0; r < kBatch; ++r) y.push_back(static_cast<float>(rng() % spec.output_dim));

  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  absl::StatusOr<std::unique_ptr<Mlp>> reference = Mlp::Create(spec, cpu.get(), kBatch);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::vector<std::vector<float>> initial = (*reference)->InitialValues(3);
  for (size_t v = 0; v < initial.size(); ++v) {
    std::copy(initial[v].begin(), initial[v].end(), (*reference)->HostParameter(v).begin());
  }
  ASSERT_TRUE((*reference)->UploadParameters().ok());
  absl::StatusOr<LossResult> expected = (*reference)->ComputeGradients(x.data(), y.data(), kBatch);
  ASSERT_TRUE(expected.ok()) << expected.status();

  std::vector<std::unique_ptr<Kernels>> gpus;
  for (int t = 0; t < 2; ++t) {
    absl::StatusOr<std::unique_ptr<Kernels>> gpu = MakeCudaKernels(t % VisibleGpuCount());
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpus.push_back(std::move(*gpu));
  }
  absl::StatusOr<std::unique_ptr<Towers>> towers =
      Towers::Create(spec, {gpus[0].get(), gpus[1].get()}, kBatch, kBatch);
  ASSERT_TRUE(towers.ok()) << towers.status();
  for (size_t v = 0; v < initial.size(); ++v) {
    std::copy(initial[v].begin(), initial[v].end(), (*towers)->HostParameter(v).begin());
  }
  ASSERT_TRUE((*towers)->UploadParameters().ok());
  std::copy(x.begin(), x.end(), (*towers)->HostInput().begin());
  std::copy(y.begin(), y.end(), (*towers)->HostTargets().begin());
  absl::StatusOr<LossResult> loss = (*towers)->ComputeGradients(
      (*towers)->HostInput().data(), (*towers)->HostTargets().data(), kBatch);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(loss->loss, expected->loss, 1e-5 * std::abs(expected->loss));
  EXPECT_EQ(loss->correct, expected->correct);
  for (size_t v = 0; v < initial.size(); ++v) {
    SCOPED_TRACE(absl::StrCat("variable ", v));
    EXPECT_LE(RelativeError((*towers)->HostGradient(v), (*reference)->HostGradient(v)), 1e-5);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
