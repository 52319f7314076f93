// The CTR model's forward and backward on the CUDA backend against the CPU
// reference: same parameters, rows and batch (multi-valued fields, empty
// bags, ids shared across examples), both poolings; loss, probabilities and
// every gradient (each dense layer's kernel and bias together, embedding
// rows, wide weights) within 1e-5 relative error. The hidden layers are
// tanh: with ReLU, a unit whose pre-activation lies within rounding of zero
// can fall on either side on the two backends and flip its whole gradient
// (one such unit in this batch moves the first layer's gradient by 0.3%
// under mean pooling). The ReLU path is compared in
// tests/kernels/cuda_kernels_test.cc and mlp_cuda_test.cc. Runs, skips or fails
// as tests/support/gpu_check.h decides.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/support/gpu_check.h"
#include "worker/model/ctr_model.h"

namespace pst {
namespace PST_FILE_ID {

constexpr double kTolerance = 1e-5;

double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

CtrBatch RandomBatch(int examples, int fields, int dense, uint32_t seed) {
  std::mt19937 rng(seed);
  CtrBatch batch(fields, dense);
  for (int e = 0; e < examples; ++e) {
    batch.labels.push_back(static_cast<float>(rng() % 2));
    for (int d = 0; d < dense; ++d) batch.dense.push_back(static_cast<float>(rng() % 100) / 50.0f);
    for (int f = 0; f < fields; ++f) {
      const int ids = static_cast<int>(rng() % 4);
      for (int k = 0; k < ids; ++k) {
        batch.ids.push_back(rng() % 500);
        batch.values.push_back(1.0f);
      }
      batch.offsets.push_back(static_cast<int32_t>(batch.ids.size()));
    }
  }
  return batch;
}

// Layer l's gradient, its kernel (variable 2l) and bias (2l + 1) together.
// A bias alone can be a sum that cancels far below its terms (the output
// bias's is the batch mean of p - y), so its own relative error measures
// the cancellation, not the kernels.
std::vector<float> LayerGradient(const std::vector<std::vector<float>>& grads, size_t layer) {
  std::vector<float> joined = grads[2 * layer];
  joined.insert(joined.end(), grads[2 * layer + 1].begin(), grads[2 * layer + 1].end());
  return joined;
}

struct Result {
  LossResult loss;
  std::vector<std::vector<float>> dense_grads;
  std::vector<float> row_grads, wide_grads, probabilities;
};

Result RunOn(Kernels* kernels, const CtrModelSpec& spec, const CtrBatch& batch,
             const CtrStepInput& input, const std::vector<float>& rows,
             const std::vector<float>& wide) {
  Result r;
  absl::StatusOr<std::unique_ptr<CtrModel>> model = CtrModel::Create(spec, kernels, batch.size());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return r;
  Mlp& mlp = (*model)->mlp();
  std::vector<std::vector<float>> init = mlp.InitialValues(5);
  EXPECT_TRUE(mlp.PrepareHostParametersForWrite().ok());
  for (size_t v = 0; v < init.size(); ++v) {
    std::copy(init[v].begin(), init[v].end(), mlp.HostParameter(v).begin());
  }
  EXPECT_TRUE(mlp.UploadParameters().ok());
  r.row_grads.resize(rows.size());
  r.wide_grads.resize(wide.size());
  absl::StatusOr<LossResult> loss =
      (*model)->ComputeGradients(batch, input, rows, wide, r.row_grads, r.wide_grads);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (loss.ok()) r.loss = *loss;
  for (size_t v = 0; v < init.size(); ++v) {
    std::span<const float> g = mlp.HostGradient(v);
    r.dense_grads.emplace_back(g.begin(), g.end());
  }
  r.probabilities.resize(batch.size());
  EXPECT_TRUE((*model)->Evaluate(batch, input, rows, wide, r.probabilities).ok());
  return r;
}

TEST(CtrModelCudaTest, ForwardAndBackwardMatchTheCpu) {
  PST_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<Kernels>> gpu = MakeCudaKernels(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<Kernels> cpu = MakeCpuKernels();
  for (PoolingKind pooling : {PoolingKind::kSum, PoolingKind::kMean}) {
    SCOPED_TRACE(pooling == PoolingKind::kSum ? "sum" : "mean");
    CtrModelSpec spec;
    spec.num_fields = 26;
    spec.dense_dim = 13;
    spec.embedding_dim = 16;
    spec.pooling = pooling;
    spec.wide = true;
    spec.hidden = {64, 32};
    spec.activation = ActivationKind::kTanh;
    const CtrBatch batch = RandomBatch(300, spec.num_fields, spec.dense_dim, 9);
    CtrStepInput input;
    ASSERT_TRUE(PrepareCtrInput(batch, spec, &input).ok());
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-0.3f, 0.3f);
    std::vector<float> rows(input.unique_ids.size() * spec.embedding_dim);
    std::vector<float> wide(input.unique_ids.size());
    for (float& x : rows) x = dist(rng);
    for (float& x : wide) x = dist(rng);
    const Result expected = RunOn(cpu.get(), spec, batch, input, rows, wide);
    const Result actual = RunOn(gpu->get(), spec, batch, input, rows, wide);
    EXPECT_NEAR(actual.loss.loss, expected.loss.loss, kTolerance * expected.loss.loss);
    EXPECT_EQ(actual.loss.correct, expected.loss.correct);
    EXPECT_LE(RelativeError(actual.row_grads, expected.row_grads), kTolerance);
    EXPECT_LE(RelativeError(actual.wide_grads, expected.wide_grads), kTolerance);
    EXPECT_LE(RelativeError(actual.probabilities, expected.probabilities), kTolerance);
    ASSERT_EQ(actual.dense_grads.size(), expected.dense_grads.size());
    ASSERT_EQ(expected.dense_grads.size(), 2 * (spec.hidden.size() + 1)) << "kernel and bias";
    for (size_t layer = 0; layer <= spec.hidden.size(); ++layer) {
      EXPECT_LE(RelativeError(LayerGradient(actual.dense_grads, layer),
                              LayerGradient(expected.dense_grads, layer)),
                kTolerance)
          << "layer " << layer;
    }
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
