// The CUDA backend against the CPU reference on fresh random inputs, kernel
// by kernel. fp32 everywhere (cuBLAS in CUBLAS_DEFAULT_MATH, no TF32): every
// result agrees to a norm-wise relative error of 1e-5. Each test runs, skips
// or fails as tests/support/gpu_check.h decides.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/column_sums.h"
#include "kernels/device.h"
#include "tests/support/gpu_check.h"

namespace pst {
namespace PST_FILE_ID {

constexpr double kTolerance = 1e-5;

std::vector<float> RandomVector(size_t n, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ||a - b|| / ||b|| (plain ||a - b|| when b is all zeros).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PST_REQUIRE_GPU();
    absl::StatusOr<std::unique_ptr<Kernels>> cuda = MakeCudaKernels(0);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    gpu_ = std::move(*cuda);
    cpu_ = MakeCpuKernels();
  }
  void TearDown() override {
    for (float* p : device_buffers_) gpu_->Free(p);
  }

  // A device copy of `host`, freed at the end of the test.
  float* Upload(const std::vector<float>& host) {
    absl::StatusOr<float*> p = gpu_->Allocate(host.size());
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    device_buffers_.push_back(*p);
    EXPECT_TRUE(gpu_->CopyToDevice(host.data(), *p, host.size()).ok());
    return *p;
  }
  // A queued loss call, the wait, and the result (as Mlp does it).
  absl::StatusOr<LossResult> WaitForLoss(const absl::Status& queued) {
    if (!queued.ok()) return queued;
    PST_RETURN_IF_ERROR(gpu_->Synchronize());
    return gpu_->TakeLoss();
  }
  std::vector<float> Download(const float* device, size_t count) {
    std::vector<float> host(count);
    absl::Status s = gpu_->CopyToHost(device, host.data(), count);
    EXPECT_TRUE(s.ok()) << s;
    return host;
  }

  std::unique_ptr<Kernels> gpu_;
  std::unique_ptr<Kernels> cpu_;
  std::vector<float*> device_buffers_;
};

TEST_F(CudaKernelsTest, NameNamesTheDevice) { EXPECT_EQ(gpu_->Name(), "cuda:0"); }

TEST_F(CudaKernelsTest, GemmMatchesTheCpuForEveryLayoutAndShape) {
  struct Shape {
    int m, n, k;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{64, 33, 129}, Shape{256, 1024, 784},
                  Shape{5, 600, 140}, Shape{1024, 10, 512}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          SCOPED_TRACE(absl::StrCat(s.m, "x", s.n, "x", s.k, " ta=", ta, " tb=", tb, " beta=", beta));
          std::vector<float> a = RandomVector(static_cast<size_t>(s.m) * s.k, 1);
          std::vector<float> b = RandomVector(static_cast<size_t>(s.k) * s.n, 2);
          std::vector<float> c = RandomVector(static_cast<size_t>(s.m) * s.n, 3);
          float* da = Upload(a);
          float* db = Upload(b);
          float* dc = Upload(c);
          ASSERT_TRUE(cpu_->Gemm(ta, tb, s.m, s.n, s.k, 0.75f, a.data(), b.data(), beta, c.data()).ok());
          absl::Status status = gpu_->Gemm(ta, tb, s.m, s.n, s.k, 0.75f, da, db, beta, dc);
          ASSERT_TRUE(status.ok()) << status;
          EXPECT_LE(RelativeError(Download(dc, c.size()), c), kTolerance);
        }
      }
    }
  }
}

TEST_F(CudaKernelsTest, GemmStridedOnBlocksOfWiderMatricesMatchesTheCpu) {
  // c's block is columns [3, 3 + 40) of a 64-wide matrix; a and b are
  // blocks of wider ones too, as the CPU towers' kernel gradients use them.
  constexpr int kM = 96, kN = 40, kK = 64;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(absl::StrCat("ta=", ta, " tb=", tb, " beta=", beta));
        const int lda = (ta ? kM : kK) + 7, ldb = (tb ? kK : kN) + 5, ldc = 64;
        std::vector<float> a = RandomVector(static_cast<size_t>(ta ? kK : kM) * lda, 7);
        std::vector<float> b = RandomVector(static_cast<size_t>(tb ? kN : kK) * ldb, 8);
        std::vector<float> c = RandomVector(static_cast<size_t>(kM) * ldc, 9);
        float* da = Upload(a);
        float* db = Upload(b);
        float* dc = Upload(c);
        ASSERT_TRUE(cpu_->GemmStrided(ta, tb, kM, kN, kK, 0.5f, a.data(), lda, b.data(), ldb,
                                      beta, c.data() + 3, ldc)
                        .ok());
        absl::Status status =
            gpu_->GemmStrided(ta, tb, kM, kN, kK, 0.5f, da, lda, db, ldb, beta, dc + 3, ldc);
        ASSERT_TRUE(status.ok()) << status;
        EXPECT_LE(RelativeError(Download(dc, c.size()), c), kTolerance);
      }
    }
  }
}

TEST_F(CudaKernelsTest, GemmStridedOverAnEmptyInnerDimensionScalesOnlyTheBlock) {
  float* c = Upload({2, 4, 9, 6, 8, 9});  // 2 x 2 in rows 3 apart
  ASSERT_TRUE(gpu_->GemmStrided(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c, 3)
                  .ok());
  EXPECT_THAT(Download(c, 6), ::testing::ElementsAre(1, 2, 9, 3, 4, 9));
  ASSERT_TRUE(gpu_->GemmStrided(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c, 3)
                  .ok());
  EXPECT_THAT(Download(c, 6), ::testing::ElementsAre(0, 0, 9, 0, 0, 9));
}

TEST_F(CudaKernelsTest, GemmWithBetaZeroIgnoresGarbageInC) {
  float* a = Upload({1, 2});
  float* b = Upload({3, 4});
  float* c = Upload({std::numeric_limits<float>::quiet_NaN()});
  ASSERT_TRUE(gpu_->Gemm(false, false, 1, 1, 2, 1.0f, a, b, 0.0f, c).ok());
  EXPECT_EQ(Download(c, 1)[0], 11.0f);
}

TEST_F(CudaKernelsTest, GemmWithAnEmptyInnerDimensionScalesC) {
  float* c = Upload({2, 4, 6});
  ASSERT_TRUE(gpu_->Gemm(false, false, 1, 3, 0, 1.0f, nullptr, nullptr, 0.5f, c).ok());
  EXPECT_THAT(Download(c, 3), ::testing::ElementsAre(1.0f, 2.0f, 3.0f));
  ASSERT_TRUE(gpu_->Gemm(false, false, 1, 3, 0, 1.0f, nullptr, nullptr, 0.0f, c).ok());
  EXPECT_THAT(Download(c, 3), ::testing::ElementsAre(0.0f, 0.0f, 0.0f));
}

TEST_F(CudaKernelsTest, GemmRejectsNegativeDimensions) {
  EXPECT_EQ(gpu_->Gemm(false, false, -1, 1, 1, 1.0f, nullptr, nullptr, 0.0f, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, AddBiasAndColumnSumsMatchTheCpu) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{3, 37}, std::pair{256, 1024},
                            std::pair{1000, 10}, std::pair{33, 8192}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    std::vector<float> y = RandomVector(static_cast<size_t>(rows) * cols, 4);
    std::vector<float> bias = RandomVector(cols, 5);
    float* dy = Upload(y);
    float* dbias = Upload(bias);
    ASSERT_TRUE(cpu_->AddBias(rows, cols, bias.data(), y.data()).ok());
    ASSERT_TRUE(gpu_->AddBias(rows, cols, dbias, dy).ok());
    EXPECT_LE(RelativeError(Download(dy, y.size()), y), kTolerance);

    std::vector<float> sums(cols);
    float* dsums = Upload(std::vector<float>(cols, std::nanf("")));
    ASSERT_TRUE(cpu_->ColumnSums(rows, cols, y.data(), sums.data()).ok());
    ASSERT_TRUE(gpu_->ColumnSums(rows, cols, dy, dsums).ok());
    EXPECT_LE(RelativeError(Download(dsums, cols), sums), kTolerance);
  }
}

TEST_F(CudaKernelsTest, ColumnSumsAreBitwiseTheReferenceOnOddShapes) {
  // The kernels and ColumnSumsReference add in the same order
  // (kernels/column_sums.h), so the results are equal, not merely close.
  for (auto [rows, cols] : {std::pair{0, 5}, std::pair{1, 1}, std::pair{7, 1}, std::pair{33, 10},
                            std::pair{1024, 10}, std::pair{1025, 3}, std::pair{3, 1025},
                            std::pair{100, 2000}, std::pair{70001, 5}, std::pair{5, 300000}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    std::vector<float> m = RandomVector(static_cast<size_t>(rows) * cols, 14);
    std::vector<float> expected(cols);
    ColumnSumsReference(rows, cols, m.data(), expected.data());
    float* dm = Upload(m.empty() ? std::vector<float>{0.0f} : m);
    float* dout = Upload(std::vector<float>(cols, std::nanf("")));
    ASSERT_TRUE(gpu_->ColumnSums(rows, cols, dm, dout).ok());
    EXPECT_EQ(Download(dout, cols), expected);
    // Twice: the same bits again.
    ASSERT_TRUE(gpu_->ColumnSums(rows, cols, dm, dout).ok());
    EXPECT_EQ(Download(dout, cols), expected);
  }
}

TEST_F(CudaKernelsTest, ActivationsAndTheirGradientsMatchTheCpu) {
  for (ActivationKind kind : {ActivationKind::kRelu, ActivationKind::kTanh}) {
    for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      SCOPED_TRACE(absl::StrCat(kind == ActivationKind::kRelu ? "relu " : "tanh ", count));
      std::vector<float> y = RandomVector(count, 6, -3.0f, 3.0f);
      std::vector<float> dy = RandomVector(count, 7);
      float* d_y = Upload(y);
      float* d_dy = Upload(dy);
      ASSERT_TRUE(cpu_->ActivationForward(kind, count, y.data()).ok());
      ASSERT_TRUE(gpu_->ActivationForward(kind, count, d_y).ok());
      EXPECT_LE(RelativeError(Download(d_y, count), y), kTolerance);
      // Backward from the CPU's forward output on both, so only the
      // backward kernels are compared.
      float* d_y_cpu = Upload(y);
      ASSERT_TRUE(cpu_->ActivationBackward(kind, count, y.data(), dy.data()).ok());
      ASSERT_TRUE(gpu_->ActivationBackward(kind, count, d_y_cpu, d_dy).ok());
      EXPECT_LE(RelativeError(Download(d_dy, count), dy), kTolerance);
    }
  }
}

std::vector<float> RandomLabels(int rows, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> labels(rows);
  for (float& l : labels) l = static_cast<float>(rng() % classes);
  return labels;
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyMatchesTheCpu) {
  for (auto [rows, classes] : {std::pair{1, 2}, std::pair{64, 10}, std::pair{1024, 10},
                               std::pair{37, 100}, std::pair{3000, 33}}) {
    SCOPED_TRACE(absl::StrCat(rows, " rows, ", classes, " classes"));
    std::vector<float> logits = RandomVector(static_cast<size_t>(rows) * classes, 8, -4.0f, 4.0f);
    std::vector<float> labels = RandomLabels(rows, classes, 9);
    std::vector<float> grad(logits.size());
    float* d_logits = Upload(logits);
    float* d_labels = Upload(labels);
    float* d_grad = Upload(grad);
    ASSERT_TRUE(
        cpu_->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), grad.data()).ok());
    ASSERT_TRUE(cpu_->Synchronize().ok());
    absl::StatusOr<LossResult> expected = cpu_->TakeLoss();
    ASSERT_TRUE(expected.ok());
    absl::StatusOr<LossResult> actual =
        WaitForLoss(gpu_->SoftmaxCrossEntropy(rows, classes, d_logits, d_labels, d_grad));
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, kTolerance * std::abs(expected->loss));
    EXPECT_EQ(actual->correct, expected->correct);
    EXPECT_LE(RelativeError(Download(d_grad, grad.size()), grad), kTolerance);

    // Evaluation: no gradient buffer, same loss and count.
    absl::StatusOr<LossResult> eval =
        WaitForLoss(gpu_->SoftmaxCrossEntropy(rows, classes, d_logits, d_labels, nullptr));
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_EQ(eval->loss, actual->loss);
    EXPECT_EQ(eval->correct, actual->correct);
  }
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropyNamesTheFirstBadLabel) {
  std::vector<float> labels = {1, 0, 2.5f, 7, 1};
  float* logits = Upload(RandomVector(5 * 3, 10));
  float* d_labels = Upload(labels);
  absl::StatusOr<LossResult> result =
      WaitForLoss(gpu_->SoftmaxCrossEntropy(5, 3, logits, d_labels, nullptr));
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), ::testing::HasSubstr("label 2.5 of row 2"));
  // The backend stays usable after a refused batch.
  float* good = Upload({1, 0, 2, 2, 1});
  EXPECT_TRUE(WaitForLoss(gpu_->SoftmaxCrossEntropy(5, 3, logits, good, nullptr)).ok());
}

TEST_F(CudaKernelsTest, MeanSquaredErrorMatchesTheCpu) {
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{64, 1}, std::pair{1024, 10},
                            std::pair{999, 777}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    const size_t count = static_cast<size_t>(rows) * cols;
    std::vector<float> pred = RandomVector(count, 11);
    std::vector<float> target = RandomVector(count, 12);
    std::vector<float> grad(count);
    float* d_pred = Upload(pred);
    float* d_target = Upload(target);
    float* d_grad = Upload(grad);
    ASSERT_TRUE(cpu_->MeanSquaredError(rows, cols, pred.data(), target.data(), grad.data()).ok());
    ASSERT_TRUE(cpu_->Synchronize().ok());
    absl::StatusOr<LossResult> expected = cpu_->TakeLoss();
    ASSERT_TRUE(expected.ok());
    absl::StatusOr<LossResult> actual =
        WaitForLoss(gpu_->MeanSquaredError(rows, cols, d_pred, d_target, d_grad));
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, kTolerance * expected->loss);
    EXPECT_EQ(actual->correct, 0);
    EXPECT_LE(RelativeError(Download(d_grad, count), grad), kTolerance);
  }
}

TEST_F(CudaKernelsTest, SigmoidCrossEntropyMatchesTheCpu) {
  for (int rows : {1, 255, 4096, 100003}) {
    SCOPED_TRACE(rows);
    std::vector<float> logits = RandomVector(rows, 21, -30.0f, 30.0f);
    std::vector<float> labels = RandomVector(rows, 22, 0.0f, 1.0f);
    for (float& y : labels) y = y < 0.3f ? 1.0f : 0.0f;
    std::vector<float> grad(rows);
    float* d_logits = Upload(logits);
    float* d_labels = Upload(labels);
    float* d_grad = Upload(grad);
    ASSERT_TRUE(cpu_->SigmoidCrossEntropy(rows, logits.data(), labels.data(), grad.data()).ok());
    ASSERT_TRUE(cpu_->Synchronize().ok());
    absl::StatusOr<LossResult> expected = cpu_->TakeLoss();
    ASSERT_TRUE(expected.ok());
    absl::StatusOr<LossResult> actual =
        WaitForLoss(gpu_->SigmoidCrossEntropy(rows, d_logits, d_labels, d_grad));
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_NEAR(actual->loss, expected->loss, kTolerance * expected->loss);
    EXPECT_EQ(actual->correct, expected->correct);
    EXPECT_LE(RelativeError(Download(d_grad, rows), grad), kTolerance);
  }
}

// Random bags over `rows` rows: every bag 0..4 entries (empty bags and rows
// read many times included), laid out with `bags_per_row` per output row of
// `stride` floats.
EmbeddingBags RandomBags(PoolingKind pooling, int bags_count, int rows, int bags_per_row, int stride,
                         uint32_t seed) {
  std::mt19937 rng(seed);
  EmbeddingBags bags;
  bags.pooling = pooling;
  bags.num_rows = rows;
  bags.bags_per_row = bags_per_row;
  bags.row_stride = stride;
  for (int b = 0; b < bags_count; ++b) {
    const int entries = static_cast<int>(rng() % 5);
    for (int e = 0; e < entries; ++e) {
      bags.slots.push_back(static_cast<int32_t>(rng() % rows));
      bags.weights.push_back(static_cast<float>(rng() % 1000) / 500.0f - 1.0f);
    }
    bags.offsets.push_back(static_cast<int32_t>(bags.slots.size()));
  }
  return bags;
}

TEST_F(CudaKernelsTest, EmbeddingBagsAndTheirBackwardMatchTheCpu) {
  struct Shape {
    int examples, fields, rows, dim, dense;
  };
  for (Shape shape : {Shape{1, 1, 1, 1, 0}, Shape{256, 26, 3000, 16, 13}, Shape{512, 3, 7, 33, 5},
                      Shape{4096, 1, 50000, 1, 0}}) {
    for (PoolingKind pooling : {PoolingKind::kSum, PoolingKind::kMean}) {
      SCOPED_TRACE(absl::StrCat(shape.examples, " examples x ", shape.fields, " fields, ",
                                shape.rows, " rows of dim ", shape.dim,
                                pooling == PoolingKind::kSum ? ", sum" : ", mean"));
      const int stride = shape.fields * shape.dim + shape.dense;
      EmbeddingBags bags = RandomBags(pooling, shape.examples * shape.fields, shape.rows,
                                      shape.fields, stride, 31);
      ASSERT_TRUE(bags.Finish(shape.dim).ok());
      const size_t out_size = static_cast<size_t>(shape.examples) * stride;
      const size_t rows_size = static_cast<size_t>(shape.rows) * shape.dim;
      std::vector<float> rows = RandomVector(rows_size, 32);
      // The dense columns must come through untouched.
      std::vector<float> out = RandomVector(out_size, 33);
      std::vector<float> out_grad = RandomVector(out_size, 34);
      std::vector<float> row_grads = RandomVector(rows_size, 35);  // all overwritten
      float* d_rows = Upload(rows);
      float* d_out = Upload(out);
      float* d_out_grad = Upload(out_grad);
      float* d_row_grads = Upload(row_grads);
      ASSERT_TRUE(cpu_->EmbeddingBagsForward(bags, shape.dim, rows.data(), out.data()).ok());
      ASSERT_TRUE(cpu_->EmbeddingBagsBackward(bags, shape.dim, out_grad.data(), row_grads.data())
                      .ok());
      ASSERT_TRUE(gpu_->EmbeddingBagsForward(bags, shape.dim, d_rows, d_out).ok());
      ASSERT_TRUE(gpu_->EmbeddingBagsBackward(bags, shape.dim, d_out_grad, d_row_grads).ok());
      EXPECT_LE(RelativeError(Download(d_out, out_size), out), kTolerance);
      EXPECT_LE(RelativeError(Download(d_row_grads, rows_size), row_grads), kTolerance);
    }
  }
}

TEST_F(CudaKernelsTest, EmbeddingBagsAreRefusedUnfinished) {
  EmbeddingBags bags = RandomBags(PoolingKind::kSum, 4, 3, 1, 0, 1);
  float* rows = Upload(RandomVector(3 * 4, 2));
  float* out = Upload(RandomVector(4 * 4, 3));
  EXPECT_EQ(gpu_->EmbeddingBagsForward(bags, 4, rows, out).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaKernelsTest, TheLossIsReadOnlyAfterTheCallersWait) {
  float* logits = Upload(RandomVector(64 * 10, 15));
  float* labels = Upload(RandomLabels(64, 10, 16));
  ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(64, 10, logits, labels, nullptr).ok());
  absl::StatusOr<LossResult> early = gpu_->TakeLoss();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(gpu_->Synchronize().ok());
  absl::StatusOr<LossResult> loss = gpu_->TakeLoss();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_GT(loss->loss, 0.0);
  EXPECT_EQ(gpu_->TakeLoss().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CudaKernelsTest, AMarkerWaitsForTheCopyQueuedBeforeIt) {
  constexpr size_t kCount = size_t{1} << 22;  // 16 MiB: the copy takes a while
  absl::StatusOr<float*> host = gpu_->AllocateHost(kCount);
  ASSERT_TRUE(host.ok()) << host.status();
  std::fill(*host, *host + kCount, 1.0f);
  absl::StatusOr<std::unique_ptr<QueueMarker>> marker = gpu_->NewMarker();
  ASSERT_TRUE(marker.ok()) << marker.status();
  EXPECT_TRUE((*marker)->Wait().ok());  // never recorded: nothing to wait for
  float* device = Upload(std::vector<float>(kCount, 0.0f));
  ASSERT_TRUE(gpu_->CopyToDevice(*host, device, kCount).ok());
  ASSERT_TRUE((*marker)->Record().ok());
  ASSERT_TRUE((*marker)->Wait().ok());
  std::fill(*host, *host + kCount, 2.0f);  // the copy has read the buffer
  std::vector<float> copied = Download(device, kCount);
  EXPECT_EQ(std::count(copied.begin(), copied.end(), 1.0f), static_cast<ptrdiff_t>(kCount));
  marker->reset();
  gpu_->FreeHost(*host);
}

TEST_F(CudaKernelsTest, PinnedHostBuffersRoundTripThroughAsyncCopies) {
  absl::StatusOr<float*> host = gpu_->AllocateHost(1000);
  ASSERT_TRUE(host.ok()) << host.status();
  std::vector<float> values = RandomVector(1000, 13);
  std::copy(values.begin(), values.end(), *host);
  float* device = Upload(std::vector<float>(1000));
  ASSERT_TRUE(gpu_->CopyToDevice(*host, device, 1000).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  std::fill(*host, *host + 1000, 0.0f);
  ASSERT_TRUE(gpu_->CopyToHostAsync(device, *host, 1000).ok());
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_EQ(std::vector<float>(*host, *host + 1000), values);
  gpu_->FreeHost(*host);
}

TEST_F(CudaKernelsTest, AnImpossibleAllocationIsAnErrorNamingTheCall) {
  absl::StatusOr<float*> huge = gpu_->Allocate(size_t{1} << 50);  // 4 PiB
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), ::testing::HasSubstr("cudaMalloc"));
  // The failure does not poison later work.
  float* c = Upload({1.0f});
  EXPECT_TRUE(gpu_->ActivationForward(ActivationKind::kRelu, 1, c).ok());
  EXPECT_EQ(Download(c, 1)[0], 1.0f);
}

}  // namespace PST_FILE_ID
}  // namespace pst
