// The CPU kernels against plain reference loops and hand-computed values.
#include <cmath>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"

namespace pst {
namespace PST_FILE_ID {

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// c = alpha op(a) op(b) + beta c, the obvious way, in double.
std::vector<float> ReferenceGemm(bool ta, bool tb, int m, int n, int k, float alpha,
                                 const std::vector<float>& a, const std::vector<float>& b,
                                 float beta, const std::vector<float>& c) {
  std::vector<float> out(c);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) {
        double av = ta ? a[static_cast<size_t>(p) * m + i] : a[static_cast<size_t>(i) * k + p];
        double bv = tb ? b[static_cast<size_t>(j) * k + p] : b[static_cast<size_t>(p) * n + j];
        sum += av * bv;
      }
      out[static_cast<size_t>(i) * n + j] =
          static_cast<float>(alpha * sum + (beta == 0 ? 0.0 : beta * c[static_cast<size_t>(i) * n + j]));
    }
  }
  return out;
}

TEST(CpuKernelsTest, GemmMatchesTheReferenceForEveryLayoutAndShape) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  struct Shape {
    int m, n, k;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{64, 33, 129}, Shape{300, 257, 65},
                  Shape{5, 600, 140}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          SCOPED_TRACE(absl::StrCat(s.m, "x", s.n, "x", s.k, " ta=", ta, " tb=", tb, " beta=", beta));
          std::vector<float> a = RandomVector(static_cast<size_t>(s.m) * s.k, 1);
          std::vector<float> b = RandomVector(static_cast<size_t>(s.k) * s.n, 2);
          std::vector<float> c = RandomVector(static_cast<size_t>(s.m) * s.n, 3);
          std::vector<float> expected = ReferenceGemm(ta, tb, s.m, s.n, s.k, 0.75f, a, b, beta, c);
          ASSERT_TRUE(kernels->Gemm(ta, tb, s.m, s.n, s.k, 0.75f, a.data(), b.data(), beta, c.data()).ok());
          double max_error = 0, max_value = 0;
          for (size_t i = 0; i < c.size(); ++i) {
            max_error = std::max(max_error, std::abs(static_cast<double>(c[i]) - expected[i]));
            max_value = std::max(max_value, std::abs(static_cast<double>(expected[i])));
          }
          EXPECT_LE(max_error, 1e-5 * std::max(1.0, max_value));
        }
      }
    }
  }
}

// `rows` x `cols` row-major values in rows `ld` floats apart, the gaps
// holding `pad`.
std::vector<float> Embed(const std::vector<float>& dense, int rows, int cols, int ld, float pad) {
  std::vector<float> wide(static_cast<size_t>(rows) * ld, pad);
  for (int r = 0; r < rows; ++r) {
    std::copy_n(dense.begin() + static_cast<ptrdiff_t>(r) * cols, cols,
                wide.begin() + static_cast<ptrdiff_t>(r) * ld);
  }
  return wide;
}

TEST(CpuKernelsTest, GemmStridedComputesOnBlocksOfWiderMatricesAndLeavesTheRestAlone) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  constexpr int kM = 37, kN = 19, kK = 23, kPad = 5;
  constexpr float kSentinel = 1234.5f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(absl::StrCat("ta=", ta, " tb=", tb, " beta=", beta));
        const int a_rows = ta ? kK : kM, a_cols = ta ? kM : kK;
        const int b_rows = tb ? kN : kK, b_cols = tb ? kK : kN;
        std::vector<float> a = RandomVector(static_cast<size_t>(kM) * kK, 4);
        std::vector<float> b = RandomVector(static_cast<size_t>(kK) * kN, 5);
        std::vector<float> c = RandomVector(static_cast<size_t>(kM) * kN, 6);
        const std::vector<float> expected = ReferenceGemm(ta, tb, kM, kN, kK, 0.5f, a, b, beta, c);
        std::vector<float> wide_a = Embed(a, a_rows, a_cols, a_cols + kPad, kSentinel);
        std::vector<float> wide_b = Embed(b, b_rows, b_cols, b_cols + 2 * kPad, kSentinel);
        std::vector<float> wide_c = Embed(c, kM, kN, kN + 3 * kPad, kSentinel);
        ASSERT_TRUE(kernels
                        ->GemmStrided(ta, tb, kM, kN, kK, 0.5f, wide_a.data(), a_cols + kPad,
                                      wide_b.data(), b_cols + 2 * kPad, beta, wide_c.data(),
                                      kN + 3 * kPad)
                        .ok());
        for (int r = 0; r < kM; ++r) {
          for (int j = 0; j < kN; ++j) {
            EXPECT_NEAR(wide_c[static_cast<size_t>(r) * (kN + 3 * kPad) + j],
                        expected[static_cast<size_t>(r) * kN + j], 1e-5);
          }
          for (int j = kN; j < kN + 3 * kPad; ++j) {
            ASSERT_EQ(wide_c[static_cast<size_t>(r) * (kN + 3 * kPad) + j], kSentinel)
                << "row " << r << " column " << j << ", outside the block";
          }
        }
      }
    }
  }
}

TEST(CpuKernelsTest, GemmStridedOverAnEmptyInnerDimensionScalesOnlyTheBlock) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> c = {2, 4, 9, 6, 8, 9};  // 2 x 2 in rows 3 apart
  ASSERT_TRUE(kernels->GemmStrided(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f,
                                   c.data(), 3)
                  .ok());
  EXPECT_THAT(c, ::testing::ElementsAre(1, 2, 9, 3, 4, 9));
}

TEST(CpuKernelsTest, GemmStridedRefusesAStrideNarrowerThanItsMatrix) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> a(6), b(6), c(4, 7.0f);
  // a is 2 x 3, b is 3 x 2, c is 2 x 2: each stride one short in turn.
  for (auto [lda, ldb, ldc] : {std::tuple{2, 2, 2}, std::tuple{3, 1, 2}, std::tuple{3, 2, 1}}) {
    SCOPED_TRACE(absl::StrCat("lda=", lda, " ldb=", ldb, " ldc=", ldc));
    EXPECT_EQ(kernels->GemmStrided(false, false, 2, 2, 3, 1.0f, a.data(), lda, b.data(), ldb,
                                   0.0f, c.data(), ldc)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(c, ::testing::Each(7.0f));
}

TEST(CpuKernelsTest, GemmWithBetaZeroIgnoresGarbageInC) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> a = {1, 2}, b = {3, 4};
  std::vector<float> c = {std::nanf("")};
  ASSERT_TRUE(kernels->Gemm(false, false, 1, 1, 2, 1.0f, a.data(), b.data(), 0.0f, c.data()).ok());
  EXPECT_EQ(c[0], 11.0f);
}

TEST(CpuKernelsTest, BiasAndColumnSums) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> y = {1, 2, 3, 4, 5, 6};  // 2 x 3
  std::vector<float> bias = {10, 20, 30};
  ASSERT_TRUE(kernels->AddBias(2, 3, bias.data(), y.data()).ok());
  EXPECT_THAT(y, ::testing::ElementsAre(11, 22, 33, 14, 25, 36));
  std::vector<float> sums(3, -1.0f);
  ASSERT_TRUE(kernels->ColumnSums(2, 3, y.data(), sums.data()).ok());
  EXPECT_THAT(sums, ::testing::ElementsAre(25, 47, 69));
}

TEST(CpuKernelsTest, ActivationsAndTheirGradients) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> relu = {-2, 0, 3};
  ASSERT_TRUE(kernels->ActivationForward(ActivationKind::kRelu, 3, relu.data()).ok());
  EXPECT_THAT(relu, ::testing::ElementsAre(0, 0, 3));
  std::vector<float> grad = {5, 5, 5};
  ASSERT_TRUE(kernels->ActivationBackward(ActivationKind::kRelu, 3, relu.data(), grad.data()).ok());
  EXPECT_THAT(grad, ::testing::ElementsAre(0, 0, 5));

  std::vector<float> t = {-1.0f, 0.0f, 0.5f};
  ASSERT_TRUE(kernels->ActivationForward(ActivationKind::kTanh, 3, t.data()).ok());
  EXPECT_FLOAT_EQ(t[0], std::tanh(-1.0f));
  EXPECT_FLOAT_EQ(t[2], std::tanh(0.5f));
  std::vector<float> g = {2, 2, 2};
  ASSERT_TRUE(kernels->ActivationBackward(ActivationKind::kTanh, 3, t.data(), g.data()).ok());
  EXPECT_FLOAT_EQ(g[0], 2 * (1 - std::tanh(-1.0f) * std::tanh(-1.0f)));
  EXPECT_FLOAT_EQ(g[1], 2.0f);
}

// A queued loss call, the wait, and the result (as Mlp does it).
absl::StatusOr<LossResult> WaitForLoss(Kernels& kernels, const absl::Status& queued) {
  if (!queued.ok()) return queued;
  PST_RETURN_IF_ERROR(kernels.Synchronize());
  return kernels.TakeLoss();
}

TEST(CpuKernelsTest, SoftmaxCrossEntropyMatchesHandValues) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  // Row 0: logits (0, ln 3) label 1 -> p = (1/4, 3/4), loss -ln(3/4), correct.
  // Row 1: logits (1000, 1000) label 0 -> p = (1/2, 1/2), loss ln 2; ties go
  // to the lowest index, so it counts as correct. Large logits must not overflow.
  std::vector<float> logits = {0.0f, std::log(3.0f), 1000.0f, 1000.0f};
  std::vector<float> labels = {1, 0};
  std::vector<float> d(4);
  absl::StatusOr<LossResult> r = WaitForLoss(
      *kernels, kernels->SoftmaxCrossEntropy(2, 2, logits.data(), labels.data(), d.data()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->loss, (-std::log(0.75) + std::log(2.0)) / 2, 1e-6);
  EXPECT_EQ(r->correct, 2);
  EXPECT_NEAR(d[0], 0.25 / 2, 1e-6);
  EXPECT_NEAR(d[1], (0.75 - 1) / 2, 1e-6);
  EXPECT_NEAR(d[2], (0.5 - 1) / 2, 1e-6);
  EXPECT_NEAR(d[3], 0.5 / 2, 1e-6);
}

TEST(CpuKernelsTest, SoftmaxCrossEntropyRefusesALabelOutOfRange) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> logits = {0, 0}, labels = {2};
  // As on a GPU, the label is checked as the loss is computed: the result
  // carries the error.
  ASSERT_TRUE(kernels->SoftmaxCrossEntropy(1, 2, logits.data(), labels.data(), nullptr).ok());
  ASSERT_TRUE(kernels->Synchronize().ok());
  absl::StatusOr<LossResult> r = kernels->TakeLoss();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("label 2 of row 0"));
  // Empty shapes are refused at the call.
  EXPECT_EQ(kernels->SoftmaxCrossEntropy(0, 2, logits.data(), labels.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuKernelsTest, TheLossIsTakenOnceAndOnlyAfterAWait) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  EXPECT_EQ(kernels->TakeLoss().status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> pred = {1, 2}, target = {0, 0};
  ASSERT_TRUE(kernels->MeanSquaredError(1, 2, pred.data(), target.data(), nullptr).ok());
  // The CPU computed it already, but the contract is the GPU's: no wait, no loss.
  absl::StatusOr<LossResult> early = kernels->TakeLoss();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), ::testing::HasSubstr("Synchronize"));
  // An asynchronous copy is no wait.
  float host = 0.0f;
  ASSERT_TRUE(kernels->CopyToHostAsync(pred.data(), &host, 1).ok());
  EXPECT_FALSE(kernels->TakeLoss().ok());
  ASSERT_TRUE(kernels->Synchronize().ok());
  absl::StatusOr<LossResult> loss = kernels->TakeLoss();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_DOUBLE_EQ(loss->loss, 2.5);
  EXPECT_EQ(kernels->TakeLoss().status().code(), absl::StatusCode::kFailedPrecondition);
  // A later loss call replaces one not taken.
  target = {1, 2};
  ASSERT_TRUE(kernels->MeanSquaredError(1, 2, pred.data(), target.data(), nullptr).ok());
  ASSERT_TRUE(kernels->MeanSquaredError(1, 1, pred.data(), pred.data(), nullptr).ok());
  ASSERT_TRUE(kernels->CopyToHost(pred.data(), &host, 1).ok());  // a wait too
  loss = kernels->TakeLoss();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(loss->loss, 0.0);
}

TEST(CpuKernelsTest, MarkersHaveNothingToWaitFor) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  absl::StatusOr<std::unique_ptr<QueueMarker>> marker = kernels->NewMarker();
  ASSERT_TRUE(marker.ok()) << marker.status();
  EXPECT_TRUE((*marker)->Wait().ok());
  EXPECT_TRUE((*marker)->Record().ok());
  EXPECT_TRUE((*marker)->Wait().ok());
}

TEST(CpuKernelsTest, MeanSquaredErrorMatchesHandValues) {
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  std::vector<float> pred = {1, 2, 3, 4}, target = {1, 0, 3, 8}, d(4);
  absl::StatusOr<LossResult> r = WaitForLoss(
      *kernels, kernels->MeanSquaredError(2, 2, pred.data(), target.data(), d.data()));
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->loss, (0 + 4 + 0 + 16) / 4.0);
  EXPECT_THAT(d, ::testing::ElementsAre(0, 1, 0, -2));  // 2 (pred - target) / 4
}

}  // namespace PST_FILE_ID
}  // namespace pst
