// Mlp gradients against central finite differences of its own loss, and
// the order in which Mlp queues work and waits for it (on DeferredKernels,
// which runs nothing before a wait, as a GPU stream at its slowest).
#include "worker/model/mlp.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/deferred_kernels.h"

namespace pst {
namespace PST_FILE_ID {

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

// A model on `kernels` with the parameters InitialValues(seed) plus
// `shift`, uploaded.
std::unique_ptr<Mlp> ModelOn(Kernels* kernels, const MlpSpec& spec, int batch, float shift) {
  absl::StatusOr<std::unique_ptr<Mlp>> mlp = Mlp::Create(spec, kernels, batch);
  EXPECT_TRUE(mlp.ok()) << mlp.status();
  if (!mlp.ok()) return nullptr;
  std::vector<std::vector<float>> init = (*mlp)->InitialValues(5);
  EXPECT_TRUE((*mlp)->PrepareHostParametersForWrite().ok());
  for (size_t v = 0; v < init.size(); ++v) {
    for (size_t i = 0; i < init[v].size(); ++i) (*mlp)->HostParameter(v)[i] = init[v][i] + shift;
  }
  EXPECT_TRUE((*mlp)->UploadParameters().ok());
  return std::move(*mlp);
}

const MlpSpec kClassifier{6, {5, 4}, 3, ActivationKind::kTanh, LossKind::kSoftmaxCrossEntropy, true};
constexpr int kRows = 7;

struct Batch {
  std::vector<float> x, y;
};

Batch ClassifierBatch() {
  Batch b{Random(static_cast<size_t>(kRows) * kClassifier.input_dim, 3, -1, 1), {}};
  for (int r = 0; r < kRows; ++r) b.y.push_back(static_cast<float>(r % kClassifier.output_dim));
  return b;
}

TEST(MlpQueueingTest, AStepWaitsForTheBackendOnceAndGetsTheCpusAnswer) {
  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  DeferredKernels deferred;
  std::unique_ptr<Mlp> reference = ModelOn(cpu.get(), kClassifier, kRows, 0.1f);
  std::unique_ptr<Mlp> queued = ModelOn(&deferred, kClassifier, kRows, 0.1f);
  ASSERT_TRUE(reference && queued);
  const Batch batch = ClassifierBatch();
  absl::StatusOr<LossResult> expected = reference->ComputeGradients(batch.x.data(), batch.y.data(), kRows);
  ASSERT_TRUE(expected.ok()) << expected.status();

  const int64_t waits_before = deferred.waits();
  absl::StatusOr<LossResult> actual = queued->ComputeGradients(batch.x.data(), batch.y.data(), kRows);
  ASSERT_TRUE(actual.ok()) << actual.status();
  // One wait, after the forward and backward passes and the gradients'
  // copies were all queued: nothing is left over, and every gradient arrived.
  EXPECT_EQ(deferred.waits() - waits_before, 1);
  EXPECT_EQ(deferred.queued(), 0u);
  EXPECT_EQ(actual->loss, expected->loss);
  EXPECT_EQ(actual->correct, expected->correct);
  for (size_t v = 0; v < reference->variables().size(); ++v) {
    SCOPED_TRACE(reference->variables()[v].name);
    std::span<const float> want = reference->HostGradient(v), got = queued->HostGradient(v);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin(), got.end()));
  }

  absl::StatusOr<LossResult> eval_expected = reference->Evaluate(batch.x.data(), batch.y.data(), kRows);
  const int64_t eval_waits_before = deferred.waits();
  absl::StatusOr<LossResult> eval = queued->Evaluate(batch.x.data(), batch.y.data(), kRows);
  ASSERT_TRUE(eval.ok() && eval_expected.ok());
  EXPECT_EQ(deferred.waits() - eval_waits_before, 1);
  EXPECT_EQ(eval->loss, eval_expected->loss);
}

TEST(MlpPlaceTensorsTest, ABackendThatComputesElsewhereIsRefused) {
  DeferredKernels deferred;
  std::unique_ptr<Mlp> mlp = ModelOn(&deferred, kClassifier, kRows, 0.0f);
  ASSERT_NE(mlp, nullptr);
  std::vector<std::vector<float>> memory;
  for (const VariableSpec& v : mlp->variables()) memory.emplace_back(v.size());
  std::vector<std::span<float>> spans(memory.begin(), memory.end());
  EXPECT_EQ(mlp->PlaceTensors(spans, spans).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MlpPlaceTensorsTest, SpansOfAnotherSizeAreRefusedAndNothingMoves) {
  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  std::unique_ptr<Mlp> mlp = ModelOn(cpu.get(), kClassifier, kRows, 0.0f);
  ASSERT_NE(mlp, nullptr);
  std::vector<std::vector<float>> memory;
  for (const VariableSpec& v : mlp->variables()) memory.emplace_back(v.size());
  memory.back().pop_back();
  std::vector<std::span<float>> spans(memory.begin(), memory.end());
  const float* before = mlp->HostParameter(0).data();
  absl::Status placed = mlp->PlaceTensors(spans, {});
  EXPECT_EQ(placed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(placed.message()), ::testing::HasSubstr(mlp->variables().back().name));
  EXPECT_EQ(mlp->HostParameter(0).data(), before);
  spans.pop_back();
  EXPECT_EQ(mlp->PlaceTensors(spans, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MlpQueueingTest, ABadLabelFailsTheStepAfterItsWait) {
  DeferredKernels deferred;
  std::unique_ptr<Mlp> mlp = ModelOn(&deferred, kClassifier, kRows, 0.0f);
  ASSERT_TRUE(mlp);
  Batch batch = ClassifierBatch();
  batch.y[4] = 3.0f;  // 3 classes: 0..2
  absl::StatusOr<LossResult> loss = mlp->ComputeGradients(batch.x.data(), batch.y.data(), kRows);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loss.status().message(), ::testing::HasSubstr("label 3 of row 4"));
  batch.y[4] = 1.0f;
  EXPECT_TRUE(mlp->ComputeGradients(batch.x.data(), batch.y.data(), kRows).ok());
}

// The loss a CPU model with parameters InitialValues + `shift` gives.
double CpuLoss(float shift, const Batch& batch) {
  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  std::unique_ptr<Mlp> mlp = ModelOn(cpu.get(), kClassifier, kRows, shift);
  absl::StatusOr<LossResult> loss = mlp->Evaluate(batch.x.data(), batch.y.data(), kRows);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return loss.ok() ? loss->loss : -1.0;
}

void OverwriteParameters(Mlp& mlp, float value) {
  for (size_t v = 0; v < mlp.variables().size(); ++v) {
    std::span<float> p = mlp.HostParameter(v);
    std::fill(p.begin(), p.end(), value);
  }
}

// The loss a CPU model with every parameter equal to `value` gives.
double CpuLossOfFilled(float value, const Batch& batch) {
  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  std::unique_ptr<Mlp> mlp = ModelOn(cpu.get(), kClassifier, kRows, 0.0f);
  OverwriteParameters(*mlp, value);
  EXPECT_TRUE(mlp->UploadParameters().ok());
  absl::StatusOr<LossResult> loss = mlp->Evaluate(batch.x.data(), batch.y.data(), kRows);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return loss.ok() ? loss->loss : -1.0;
}

TEST(MlpQueueingTest, ParametersRewrittenAfterPreparingDoNotReachTheQueuedUpload) {
  const Batch batch = ClassifierBatch();
  DeferredKernels deferred;
  std::unique_ptr<Mlp> mlp = ModelOn(&deferred, kClassifier, kRows, 0.1f);
  ASSERT_TRUE(mlp);
  // The next step's parameters arrive while the upload is still queued.
  ASSERT_TRUE(mlp->PrepareHostParametersForWrite().ok());
  OverwriteParameters(*mlp, 0.5f);
  absl::StatusOr<LossResult> loss = mlp->Evaluate(batch.x.data(), batch.y.data(), kRows);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->loss, CpuLoss(0.1f, batch));
  // And the rewritten values are what the next upload sends.
  ASSERT_TRUE(mlp->UploadParameters().ok());
  absl::StatusOr<LossResult> after = mlp->Evaluate(batch.x.data(), batch.y.data(), kRows);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->loss, CpuLossOfFilled(0.5f, batch));
}

TEST(MlpQueueingTest, RewritingWithoutPreparingCorruptsTheQueuedUpload) {
  // What PrepareHostParametersForWrite prevents, shown on the deferred
  // backend: the upload reads the pinned buffers when it runs, so a rewrite
  // before it has run is what the model computes with. On a GPU this is a
  // race; here it happens every time.
  const Batch batch = ClassifierBatch();
  DeferredKernels deferred;
  std::unique_ptr<Mlp> mlp = ModelOn(&deferred, kClassifier, kRows, 0.1f);
  ASSERT_TRUE(mlp);
  OverwriteParameters(*mlp, 0.5f);
  absl::StatusOr<LossResult> loss = mlp->Evaluate(batch.x.data(), batch.y.data(), kRows);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->loss, CpuLossOfFilled(0.5f, batch));
  EXPECT_NE(loss->loss, CpuLoss(0.1f, batch));
}

}  // namespace PST_FILE_ID
}  // namespace pst
