// Towers against one device computing the whole batch.
#include "worker/model/towers.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/support/deferred_kernels.h"

namespace pst {
namespace PST_FILE_ID {

MlpSpec SmallClassifier() {
  MlpSpec spec;
  spec.input_dim = 12;
  spec.hidden = {16, 8};
  spec.output_dim = 5;
  spec.loss = LossKind::kSoftmaxCrossEntropy;
  return spec;
}

struct Batch {
  std::vector<float> x, y;
};

Batch RandomBatch(const MlpSpec& spec, int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  Batch b;
  b.x.resize(static_cast<size_t>(rows) * spec.input_dim);
  for (float& v : b.x) v = value(rng);
  for (int r = 0; r < rows; ++r) b.y.push_back(static_cast<float>(rng() % spec.output_dim));
  return b;
}

double RelativeError(std::span<const float> a, std::span<const float> b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// Sets every tower's (and the reference's) parameters to the seeded values.
void LoadInitialValues(const std::vector<std::vector<float>>& values,
                       const std::function<std::span<float>(size_t)>& host) {
  for (size_t i = 0; i < values.size(); ++i) {
    std::copy(values[i].begin(), values[i].end(), host(i).begin());
  }
}

TEST(TowersTest, TTowersOfBOverTRowsGiveTheGradientOfOneDeviceWithBRows) {
  constexpr int kBatch = 24;
  const MlpSpec spec = SmallClassifier();
  const Batch batch = RandomBatch(spec, kBatch, 7);
  std::unique_ptr<Kernels> reference_kernels = MakeCpuKernels();
  absl::StatusOr<std::unique_ptr<Mlp>> reference = Mlp::Create(spec, reference_kernels.get(), kBatch);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::vector<std::vector<float>> initial = (*reference)->InitialValues(3);
  LoadInitialValues(initial, [&](size_t i) { return (*reference)->HostParameter(i); });
  ASSERT_TRUE((*reference)->UploadParameters().ok());
  absl::StatusOr<LossResult> expected =
      (*reference)->ComputeGradients(batch.x.data(), batch.y.data(), kBatch);
  ASSERT_TRUE(expected.ok()) << expected.status();

  for (int count : {1, 2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat(count, " towers"));
    std::vector<std::unique_ptr<Kernels>> owned;
    std::vector<Kernels*> backends;
    for (int t = 0; t < count; ++t) {
      owned.push_back(MakeCpuKernels());
      backends.push_back(owned.back().get());
    }
    absl::StatusOr<std::unique_ptr<Towers>> towers = Towers::Create(spec, backends, kBatch, 50);
    ASSERT_TRUE(towers.ok()) << towers.status();
    EXPECT_EQ((*towers)->DevicesLabel(), count == 1 ? "cpu" : absl::StrCat("cpu:", count));
    LoadInitialValues(initial, [&](size_t i) { return (*towers)->HostParameter(i); });
    ASSERT_TRUE((*towers)->UploadParameters().ok());
    absl::StatusOr<LossResult> loss =
        (*towers)->ComputeGradients(batch.x.data(), batch.y.data(), kBatch);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(loss->loss, expected->loss, 1e-5 * std::abs(expected->loss));
    EXPECT_EQ(loss->correct, expected->correct);
    for (size_t v = 0; v < initial.size(); ++v) {
      SCOPED_TRACE(absl::StrCat("variable ", v));
      EXPECT_LE(RelativeError((*towers)->HostGradient(v), (*reference)->HostGradient(v)), 1e-5);
    }
  }
}

// Two CPU towers for batches of `batch` rows, holding the initial values of
// seed 5, and the backends they borrow.
struct TwoCpuTowers {
  std::vector<std::unique_ptr<Kernels>> backends;
  std::unique_ptr<Towers> towers;
};

void MakeTwoCpuTowers(const MlpSpec& spec, int batch, TwoCpuTowers* out) {
  for (int t = 0; t < 2; ++t) out->backends.push_back(MakeCpuKernels());
  absl::StatusOr<std::unique_ptr<Towers>> towers = Towers::Create(
      spec, {out->backends[0].get(), out->backends[1].get()}, batch, batch);
  ASSERT_TRUE(towers.ok()) << towers.status();
  out->towers = std::move(*towers);
  Towers& made = *out->towers;
  LoadInitialValues(made.InitialValues(5), [&](size_t i) { return made.HostParameter(i); });
  ASSERT_TRUE(made.UploadParameters().ok());
}

// A copy of every variable's gradient of the last step.
std::vector<std::vector<float>> Gradients(const Towers& towers) {
  std::vector<std::vector<float>> gradients;
  for (size_t v = 0; v < towers.variables().size(); ++v) {
    std::span<const float> g = towers.HostGradient(v);
    gradients.emplace_back(g.begin(), g.end());
  }
  return gradients;
}

TEST(TowersTest, TheAverageIsBitwiseTheSameEveryTime) {
  constexpr int kBatch = 16;
  const MlpSpec spec = SmallClassifier();
  const Batch batch = RandomBatch(spec, kBatch, 9);
  TwoCpuTowers two;
  ASSERT_NO_FATAL_FAILURE(MakeTwoCpuTowers(spec, kBatch, &two));
  Towers& towers = *two.towers;
  ASSERT_TRUE(towers.ComputeGradients(batch.x.data(), batch.y.data(), kBatch).ok());
  const std::vector<std::vector<float>> first = Gradients(towers);
  for (int run = 1; run < 20; ++run) {
    ASSERT_TRUE(towers.ComputeGradients(batch.x.data(), batch.y.data(), kBatch).ok());
    ASSERT_TRUE(Gradients(towers) == first) << "run " << run;
  }
}

// CPU towers compute their kernel gradients together, by columns, from all
// towers' rows; the hooked pass averages per-tower gradients. The two are
// the same sums, to rounding (one product over the batch's rows against
// one per slice).
TEST(TowersTest, KernelGradientsByColumnsMatchTheAverageOfTheTowers) {
  constexpr int kBatch = 64;
  MlpSpec spec;
  spec.input_dim = 96;
  spec.hidden = {64, 32};
  spec.output_dim = 10;
  const Batch batch = RandomBatch(spec, kBatch, 11);
  TwoCpuTowers two;
  ASSERT_NO_FATAL_FAILURE(MakeTwoCpuTowers(spec, kBatch, &two));
  Towers& towers = *two.towers;
  ASSERT_TRUE(towers.ComputeGradients(batch.x.data(), batch.y.data(), kBatch).ok());
  const std::vector<std::vector<float>> by_columns = Gradients(towers);
  const Mlp::LayerHooks hooks{.parameters_needed = [](int) { return absl::OkStatus(); },
                              .gradients_ready = [](int) { return absl::OkStatus(); }};
  ASSERT_TRUE(towers.ComputeGradients(batch.x.data(), batch.y.data(), kBatch, hooks).ok());
  for (size_t v = 0; v < towers.variables().size(); ++v) {
    std::span<const float> averaged = towers.HostGradient(v);
    EXPECT_LE(RelativeError(by_columns[v], averaged), 1e-6) << towers.variables()[v].name;
  }
}

// A tower that fails before its backward pass never reaches the layers the
// other towers wait at for its output gradients: they are released, and the
// step fails with that tower's error, not theirs.
TEST(TowersTest, ATowerThatFailsBeforeItsBackwardReleasesTheTowersWaitingForIt) {
  constexpr int kBatch = 8;
  const MlpSpec spec = SmallClassifier();
  std::vector<std::unique_ptr<Kernels>> backends;
  for (int t = 0; t < 2; ++t) backends.push_back(MakeCpuKernels());
  // Tower 0 takes up to 32 rows (it evaluates), tower 1 its slice of 4.
  absl::StatusOr<std::unique_ptr<Towers>> towers =
      Towers::Create(spec, {backends[0].get(), backends[1].get()}, kBatch, 32);
  ASSERT_TRUE(towers.ok()) << towers.status();
  LoadInitialValues((*towers)->InitialValues(5),
                    [&](size_t i) { return (*towers)->HostParameter(i); });
  ASSERT_TRUE((*towers)->UploadParameters().ok());
  const Batch twice = RandomBatch(spec, 2 * kBatch, 4);
  absl::StatusOr<LossResult> failed =
      (*towers)->ComputeGradients(twice.x.data(), twice.y.data(), 2 * kBatch);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument) << failed.status();
  EXPECT_NE(failed.status().message().find("tower 1"), std::string::npos) << failed.status();
  const Batch good = RandomBatch(spec, kBatch, 3);
  EXPECT_TRUE((*towers)->ComputeGradients(good.x.data(), good.y.data(), kBatch).ok());
}

// Towers that fill their own rows compute what they compute on the batch
// gathered beforehand, each tower asking for its slice once.
TEST(TowersTest, TowersThatFillTheirOwnRowsComputeAsOnTheGatheredBatch) {
  constexpr int kBatch = 12;
  const MlpSpec spec = SmallClassifier();
  const Batch batch = RandomBatch(spec, kBatch, 13);
  for (int count : {1, 3}) {
    SCOPED_TRACE(absl::StrCat(count, " towers"));
    std::vector<std::unique_ptr<Kernels>> owned;
    std::vector<Kernels*> backends;
    for (int t = 0; t < count; ++t) {
      owned.push_back(MakeCpuKernels());
      backends.push_back(owned.back().get());
    }
    absl::StatusOr<std::unique_ptr<Towers>> made = Towers::Create(spec, backends, kBatch, kBatch);
    ASSERT_TRUE(made.ok()) << made.status();
    Towers& towers = **made;
    LoadInitialValues(towers.InitialValues(5), [&](size_t i) { return towers.HostParameter(i); });
    ASSERT_TRUE(towers.UploadParameters().ok());
    ASSERT_TRUE(towers.ComputeGradients(batch.x.data(), batch.y.data(), kBatch).ok());
    const std::vector<std::vector<float>> expected = Gradients(towers);

    std::vector<float> x(batch.x.size(), std::nanf("")), y(batch.y.size(), -1.0f);
    absl::Mutex mu;
    std::vector<std::pair<int, int>> asked;
    absl::StatusOr<LossResult> loss =
        towers.ComputeGradients(x.data(), y.data(), kBatch, [&](int first, int rows) {
          std::copy_n(batch.x.begin() + first * spec.input_dim, rows * spec.input_dim,
                      x.begin() + first * spec.input_dim);
          std::copy_n(batch.y.begin() + first, rows, y.begin() + first);
          absl::MutexLock lock(&mu);
          asked.emplace_back(first, rows);
        });
    ASSERT_TRUE(loss.ok()) << loss.status();
    std::sort(asked.begin(), asked.end());
    std::vector<std::pair<int, int>> slices;
    for (int t = 0; t < count; ++t) slices.emplace_back(t * kBatch / count, kBatch / count);
    EXPECT_EQ(asked, slices);
    for (size_t v = 0; v < expected.size(); ++v) {
      std::span<const float> g = towers.HostGradient(v);
      EXPECT_TRUE(std::equal(g.begin(), g.end(), expected[v].begin())) << "variable " << v;
    }
  }
}

// Towers off host memory (GPU towers; here the CPU behind DeferredKernels,
// which plays a device queue) average their own gradients after meeting
// at a barrier: the same gradient as CPU towers to rounding, and a tower
// that fails releases the others and fails the step with its error.
TEST(TowersTest, TowersOffHostMemoryAverageAndAFailingOneFailsTheStep) {
  constexpr int kBatch = 8;
  const MlpSpec spec = SmallClassifier();
  const Batch good = RandomBatch(spec, kBatch, 3);
  TwoCpuTowers cpu;
  ASSERT_NO_FATAL_FAILURE(MakeTwoCpuTowers(spec, kBatch, &cpu));
  ASSERT_TRUE(cpu.towers->ComputeGradients(good.x.data(), good.y.data(), kBatch).ok());

  std::vector<std::unique_ptr<Kernels>> owned;
  for (int t = 0; t < 2; ++t) owned.push_back(std::make_unique<DeferredKernels>());
  absl::StatusOr<std::unique_ptr<Towers>> made =
      Towers::Create(spec, {owned[0].get(), owned[1].get()}, kBatch, kBatch);
  ASSERT_TRUE(made.ok()) << made.status();
  Towers& towers = **made;
  ASSERT_FALSE(towers.ComputesOnHostMemory());
  LoadInitialValues(towers.InitialValues(5), [&](size_t i) { return towers.HostParameter(i); });
  ASSERT_TRUE(towers.UploadParameters().ok());
  ASSERT_TRUE(towers.ComputeGradients(good.x.data(), good.y.data(), kBatch).ok());
  for (size_t v = 0; v < towers.variables().size(); ++v) {
    EXPECT_LE(RelativeError(towers.HostGradient(v), cpu.towers->HostGradient(v)), 1e-6)
        << "variable " << v;
  }

  Batch bad = good;
  bad.y[kBatch - 1] = static_cast<float>(spec.output_dim);  // in tower 1's slice only
  absl::StatusOr<LossResult> failed = towers.ComputeGradients(bad.x.data(), bad.y.data(), kBatch);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(failed.status().message().find("tower 1"), std::string::npos) << failed.status();
  EXPECT_TRUE(towers.ComputeGradients(good.x.data(), good.y.data(), kBatch).ok());
}

// CPU towers keep their slices' rows where the batch they were made for
// puts them: a smaller batch would leave gaps between them, and is refused
// rather than computed from stale rows.
TEST(TowersTest, CpuTowersRefuseABatchSmallerThanTheOneTheyWereMadeFor) {
  constexpr int kBatch = 8;
  const MlpSpec spec = SmallClassifier();
  TwoCpuTowers two;
  ASSERT_NO_FATAL_FAILURE(MakeTwoCpuTowers(spec, kBatch, &two));
  const Batch half = RandomBatch(spec, kBatch / 2, 6);
  absl::StatusOr<LossResult> loss =
      two.towers->ComputeGradients(half.x.data(), half.y.data(), kBatch / 2);
  ASSERT_FALSE(loss.ok());
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument) << loss.status();
}

// One tower failing on its slice fails the step with its error, while the
// other towers, which succeeded, leave the average alone and do not wait
// for it forever; the next good batch gives the gradient as ever.
TEST(TowersTest, ATowerThatFailsFailsTheStepAndTheNextStepComputes) {
  constexpr int kBatch = 8;
  const MlpSpec spec = SmallClassifier();
  const Batch good = RandomBatch(spec, kBatch, 3);
  Batch bad = good;
  bad.y[kBatch - 1] = static_cast<float>(spec.output_dim);  // in tower 1's slice only
  TwoCpuTowers two;
  ASSERT_NO_FATAL_FAILURE(MakeTwoCpuTowers(spec, kBatch, &two));
  Towers& towers = *two.towers;
  ASSERT_TRUE(towers.ComputeGradients(good.x.data(), good.y.data(), kBatch).ok());
  const std::vector<std::vector<float>> expected = Gradients(towers);

  absl::StatusOr<LossResult> failed =
      towers.ComputeGradients(bad.x.data(), bad.y.data(), kBatch);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(failed.status().message().find("tower 1"), std::string::npos) << failed.status();

  ASSERT_TRUE(towers.ComputeGradients(good.x.data(), good.y.data(), kBatch).ok());
  for (size_t v = 0; v < expected.size(); ++v) {
    std::span<const float> g = towers.HostGradient(v);
    EXPECT_TRUE(std::equal(g.begin(), g.end(), expected[v].begin())) << "variable " << v;
  }
}

// Memory of the test's own, handed out as a transport's allocator would:
// variable i's values in parameters[i], its gradient in gradients[i].
class VectorAllocator final : public TensorAllocator {
 public:
  VectorAllocator(std::vector<std::vector<float>>* parameters,
                  std::vector<std::vector<float>>* gradients)
      : parameters_(parameters), gradients_(gradients) {}
  absl::StatusOr<Memory> Allocate(int index, const VariableSpec& spec) override {
    asked_.push_back(spec.name);
    return Memory{.values = (*parameters_)[index], .gradient = (*gradients_)[index]};
  }
  const std::vector<std::string>& asked() const { return asked_; }

 private:
  std::vector<std::vector<float>>* parameters_;
  std::vector<std::vector<float>>* gradients_;
  std::vector<std::string> asked_;
};

// Towers that compute on memory from an allocator (Towers::AllocateFrom)
// against the same towers on their own: the same gradients, left there.
class PlacedTowersTest : public ::testing::TestWithParam<int> {};

TEST_P(PlacedTowersTest, PlacedTensorsGiveTheSameGradientsWhereTheyLie) {
  constexpr int kBatch = 16;
  const MlpSpec spec = SmallClassifier();
  const Batch batch = RandomBatch(spec, kBatch, 4);
  std::vector<std::unique_ptr<Kernels>> owned;
  std::vector<Kernels*> own_backends, placed_backends;
  for (int t = 0; t < GetParam(); ++t) {
    own_backends.push_back(owned.emplace_back(MakeCpuKernels()).get());
    placed_backends.push_back(owned.emplace_back(MakeCpuKernels()).get());
  }
  absl::StatusOr<std::unique_ptr<Towers>> own = Towers::Create(spec, own_backends, kBatch, kBatch);
  absl::StatusOr<std::unique_ptr<Towers>> placed =
      Towers::Create(spec, placed_backends, kBatch, kBatch);
  ASSERT_TRUE(own.ok() && placed.ok());
  ASSERT_TRUE((*placed)->ComputesOnHostMemory());
  const std::vector<std::vector<float>> initial = (*own)->InitialValues(5);
  LoadInitialValues(initial, [&](size_t i) { return (*own)->HostParameter(i); });
  LoadInitialValues(initial, [&](size_t i) { return (*placed)->HostParameter(i); });

  std::vector<std::vector<float>> parameters, gradients;
  for (const VariableSpec& v : (*placed)->variables()) {
    parameters.emplace_back(v.size(), 0.0f);
    gradients.emplace_back(v.size(), 0.0f);
  }
  VectorAllocator allocator(&parameters, &gradients);
  ASSERT_TRUE((*placed)->AllocateFrom(allocator).ok());
  ASSERT_EQ(allocator.asked().size(), initial.size());  // once per variable, in order
  for (size_t v = 0; v < initial.size(); ++v) {
    EXPECT_EQ(allocator.asked()[v], (*placed)->variables()[v].name);
  }
  for (size_t v = 0; v < initial.size(); ++v) {
    EXPECT_EQ((*placed)->HostParameter(v).data(), parameters[v].data());
    EXPECT_EQ(parameters[v], initial[v]);  // the values came along
  }

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    ASSERT_TRUE((*own)->UploadParameters().ok());
    ASSERT_TRUE((*placed)->UploadParameters().ok());
    ASSERT_TRUE((*own)->ComputeGradients(batch.x.data(), batch.y.data(), kBatch).ok());
    ASSERT_TRUE((*placed)->ComputeGradients(batch.x.data(), batch.y.data(), kBatch).ok());
    for (size_t v = 0; v < initial.size(); ++v) {
      EXPECT_EQ((*placed)->HostGradient(v).data(), gradients[v].data());
      std::span<const float> want = (*own)->HostGradient(v);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), gradients[v].begin(), gradients[v].end()))
          << "variable " << v;
    }
    // New values written where the exchange would leave them are what the
    // next step computes with.
    for (size_t v = 0; v < initial.size(); ++v) {
      for (size_t i = 0; i < parameters[v].size(); ++i) {
        parameters[v][i] = initial[v][i] * 0.5f;
        (*own)->HostParameter(v)[i] = initial[v][i] * 0.5f;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OneAndTwoTowers, PlacedTowersTest, ::testing::Values(1, 2));

// Memory of the wrong size, or an allocator that fails, leaves the towers
// computing where they did, on the values they had.
TEST(TowersTest, AllocatorMemoryOfAnotherSizeOrAFailedAllocationMovesNothing) {
  constexpr int kBatch = 8;
  const MlpSpec spec = SmallClassifier();
  std::vector<std::unique_ptr<Kernels>> owned;
  std::vector<Kernels*> backends;
  for (int t = 0; t < 2; ++t) backends.push_back(owned.emplace_back(MakeCpuKernels()).get());
  absl::StatusOr<std::unique_ptr<Towers>> towers = Towers::Create(spec, backends, kBatch, kBatch);
  ASSERT_TRUE(towers.ok());
  const std::vector<std::vector<float>> initial = (*towers)->InitialValues(5);
  LoadInitialValues(initial, [&](size_t i) { return (*towers)->HostParameter(i); });
  const float* before = (*towers)->HostParameter(0).data();

  std::vector<std::vector<float>> parameters, gradients;
  for (const VariableSpec& v : (*towers)->variables()) {
    parameters.emplace_back(v.size() + 1, 0.0f);  // one float too many
    gradients.emplace_back(v.size(), 0.0f);
  }
  VectorAllocator wrong_size(&parameters, &gradients);
  EXPECT_EQ((*towers)->AllocateFrom(wrong_size).code(), absl::StatusCode::kInvalidArgument);

  class Failing final : public TensorAllocator {
   public:
    absl::StatusOr<Memory> Allocate(int index, const VariableSpec&) override {
      if (index == 1) return absl::UnavailableError("no region");
      return Memory{};
    }
  } failing;
  EXPECT_EQ((*towers)->AllocateFrom(failing).code(), absl::StatusCode::kUnavailable);

  EXPECT_EQ((*towers)->HostParameter(0).data(), before);
  for (size_t v = 0; v < initial.size(); ++v) {
    std::span<const float> now = (*towers)->HostParameter(v);
    EXPECT_TRUE(std::equal(now.begin(), now.end(), initial[v].begin(), initial[v].end()));
  }
}

TEST(TowersTest, RefusesABatchThatDoesNotSplitEvenly) {
  std::vector<std::unique_ptr<Kernels>> owned;
  for (int t = 0; t < 3; ++t) owned.push_back(MakeCpuKernels());
  absl::StatusOr<std::unique_ptr<Towers>> towers = Towers::Create(
      SmallClassifier(), {owned[0].get(), owned[1].get(), owned[2].get()}, 32, 32);
  ASSERT_FALSE(towers.ok());
  EXPECT_EQ(towers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(towers.status().message().find("divisible"), std::string::npos) << towers.status();
}

}  // namespace PST_FILE_ID
}  // namespace pst
