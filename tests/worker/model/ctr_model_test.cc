// The CTR model's gradients against finite differences of its loss, for
// both poolings, with the wide part: the embedding rows' (aggregated per
// unique id), the wide weights' and the MLP's.
#include "worker/model/ctr_model.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;

// Five examples of three fields: bags of 0..3 ids with values, ids shared
// between fields, examples and within one bag.
CtrBatch SmallBatch() {
  CtrBatch batch(3, 2);
  std::mt19937 rng(7);
  for (int example = 0; example < 5; ++example) {
    batch.labels.push_back(static_cast<float>(example % 2));
    batch.dense.push_back(0.5f * example);
    batch.dense.push_back(1.0f - 0.3f * example);
    for (int field = 0; field < 3; ++field) {
      const int ids = static_cast<int>(rng() % 4);
      for (int k = 0; k < ids; ++k) {
        batch.ids.push_back(100 + rng() % 6);
        batch.values.push_back(0.5f + static_cast<float>(rng() % 4) * 0.5f);
      }
      batch.offsets.push_back(static_cast<int32_t>(batch.ids.size()));
    }
  }
  return batch;
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(CtrInputTest, UniqueIdsInFirstSeenOrderAndOneWideBagPerExample) {
  CtrBatch batch(2, 0);
  batch.labels = {1, 0};
  batch.ids = {7, 9, 7, 3};
  batch.values = {1, 1, 1, 2};
  batch.offsets = {0, 1, 2, 2, 4};  // example 1's field 0 is empty
  CtrModelSpec spec;
  spec.num_fields = 2;
  spec.embedding_dim = 4;
  spec.wide = true;
  CtrStepInput input;
  ASSERT_TRUE(PrepareCtrInput(batch, spec, &input).ok());
  EXPECT_THAT(input.unique_ids, ElementsAre(7u, 9u, 3u));
  EXPECT_THAT(input.deep.slots, ElementsAre(0, 1, 0, 2));
  EXPECT_THAT(input.wide.offsets, ElementsAre(0, 2, 4));
  CtrBatch other(3, 0);
  EXPECT_FALSE(PrepareCtrInput(other, spec, &input).ok());
}

class CtrModelGradientTest : public ::testing::TestWithParam<PoolingKind> {};

TEST_P(CtrModelGradientTest, GradientsMatchFiniteDifferences) {
  auto kernels = MakeCpuKernels();
  CtrModelSpec spec{.num_fields = 3, .dense_dim = 2, .embedding_dim = 4, .pooling = GetParam(),
                    .wide = true, .hidden = {6}, .activation = ActivationKind::kTanh};
  absl::StatusOr<std::unique_ptr<CtrModel>> model = CtrModel::Create(spec, kernels.get(), 8);
  ASSERT_TRUE(model.ok()) << model.status();
  Mlp& mlp = (*model)->mlp();
  std::vector<std::vector<float>> initial = mlp.InitialValues(3);
  for (size_t i = 0; i < initial.size(); ++i) {
    std::vector<float> bias_noise = Random(initial[i].size(), 50 + i);
    for (size_t k = 0; k < initial[i].size(); ++k) initial[i][k] += 0.2f * bias_noise[k];
    std::copy(initial[i].begin(), initial[i].end(), mlp.HostParameter(i).begin());
  }
  ASSERT_TRUE(mlp.UploadParameters().ok());
  const CtrBatch batch = SmallBatch();
  CtrStepInput input;
  ASSERT_TRUE(PrepareCtrInput(batch, spec, &input).ok());
  const size_t unique = input.unique_ids.size();
  ASSERT_GE(unique, 4u);
  std::vector<float> rows = Random(unique * spec.embedding_dim, 1);
  std::vector<float> wide = Random(unique, 2);
  std::vector<float> row_grads(rows.size()), wide_grads(wide.size());
  absl::StatusOr<LossResult> trained =
      (*model)->ComputeGradients(batch, input, rows, wide, row_grads, wide_grads);
  ASSERT_TRUE(trained.ok()) << trained.status();
  std::vector<std::vector<float>> dense_grads;
  for (size_t i = 0; i < mlp.variables().size(); ++i) {
    std::span<const float> g = mlp.HostGradient(i);
    dense_grads.emplace_back(g.begin(), g.end());
  }
  std::vector<float> probabilities(batch.size());
  auto loss = [&]() -> double {
    absl::StatusOr<LossResult> evaluated =
        (*model)->Evaluate(batch, input, rows, wide, probabilities);
    EXPECT_TRUE(evaluated.ok()) << evaluated.status();
    return evaluated.ok() ? evaluated->loss : 0.0;
  };
  EXPECT_NEAR(loss(), trained->loss, 1e-6);
  constexpr float kStep = 1e-2f;
  constexpr double kTolerance = 1e-3;
  auto check = [&](float* value, float analytic, const std::string& what) {
    const float saved = *value;
    *value = saved + kStep;
    const double up = loss();
    *value = saved - kStep;
    const double down = loss();
    *value = saved;
    EXPECT_NEAR((up - down) / (2 * kStep), analytic, kTolerance) << what;
  };
  for (size_t i = 0; i < rows.size(); ++i) check(&rows[i], row_grads[i], absl::StrCat("row ", i));
  for (size_t i = 0; i < wide.size(); ++i) check(&wide[i], wide_grads[i], absl::StrCat("wide ", i));
  for (size_t v = 0; v < dense_grads.size(); ++v) {
    std::span<float> values = mlp.HostParameter(v);
    for (size_t k = 0; k < values.size(); ++k) {
      check(&values[k], dense_grads[v][k], absl::StrCat(mlp.variables()[v].name, "[", k, "]"));
    }
  }
  // An id no bag reads gets no gradient: every unique id is read, and the
  // gradients are not all zero.
  double norm = 0.0;
  for (float g : row_grads) norm += std::abs(g);
  EXPECT_GT(norm, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Poolings, CtrModelGradientTest,
                         ::testing::Values(PoolingKind::kSum, PoolingKind::kMean),
                         [](const auto& info) {
                           return info.param == PoolingKind::kSum ? "Sum" : "Mean";
                         });

TEST(CtrModelTest, RefusesMismatchedShapes) {
  auto kernels = MakeCpuKernels();
  CtrModelSpec spec;
  spec.num_fields = 3;
  spec.dense_dim = 2;
  spec.embedding_dim = 4;
  spec.hidden = {4};
  absl::StatusOr<std::unique_ptr<CtrModel>> model = CtrModel::Create(spec, kernels.get(), 8);
  ASSERT_TRUE(model.ok());
  const CtrBatch batch = SmallBatch();
  CtrStepInput input;
  ASSERT_TRUE(PrepareCtrInput(batch, spec, &input).ok());
  std::vector<float> rows(input.unique_ids.size() * 4 - 1);
  std::vector<float> grads(rows.size());
  EXPECT_EQ((*model)->ComputeGradients(batch, input, rows, {}, grads, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CtrModel::Create(CtrModelSpec{}, kernels.get(), 8).ok());
}

}  // namespace PST_FILE_ID
}  // namespace pst
