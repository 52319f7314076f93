#include "ps_server/core/step_aggregate.h"

#include <algorithm>
#include <array>
#include <utility>

#include "common/tensor_codec.h"
#include "ps_server/core/sync_reduce.h"

namespace pst {
namespace {

// Elements decoded at a time: the block stays in L1 while it is added.
constexpr size_t kBlock = 2048;

// sum = 0 + values (the first rank: 0 + -0 is +0, as in the sum's
// definition) or sum += values.
void Accumulate(float* __restrict sum, const float* __restrict values, size_t n, bool first) {
  if (first) {
    for (size_t i = 0; i < n; ++i) sum[i] = 0.0f + values[i];
  } else {
    for (size_t i = 0; i < n; ++i) sum[i] += values[i];
  }
}

}  // namespace

StepAggregate::StepAggregate(int num_workers)
    : num_workers_(num_workers), slots_(num_workers, Slot::kEmpty), waiting_(num_workers) {}

void StepAggregate::Reset(std::vector<size_t> sizes) {
  absl::MutexLock lock(&mu_);
  sizes_ = std::move(sizes);
  sum_.assign(sizes_.size(), {});  // allocated by the first step
  for (std::vector<std::vector<float>>& rank : waiting_) rank.clear();
  std::fill(slots_.begin(), slots_.end(), Slot::kEmpty);
  next_ = 0;
  sum_started_ = false;
}

void StepAggregate::AddToSum(const PushRequest& push, std::span<const int> indices) {
  std::array<float, kBlock> block;
  for (size_t i = 0; i < indices.size(); ++i) {
    const Tensor& gradient = push.gradients(static_cast<int>(i));
    const size_t width = static_cast<size_t>(DTypeBytes(gradient.dtype()));
    std::vector<float>& sum = sum_[indices[i]];
    sum.resize(sizes_[indices[i]]);
    for (size_t first = 0; first < sum.size(); first += kBlock) {
      const size_t len = std::min(kBlock, sum.size() - first);
      DecodeValues(absl::string_view(gradient.data()).substr(first * width, len * width),
                   gradient.dtype(), {block.data(), len});
      Accumulate(sum.data() + first, block.data(), len, !sum_started_);
    }
  }
  sum_started_ = true;
}

void StepAggregate::Land(int rank, const PushRequest& push, std::span<const int> indices) {
  mu_.Lock();
  const bool in_turn = !summing_ && next_ == rank;
  slots_[rank] = Slot::kFilling;
  if (in_turn) summing_ = true;
  mu_.Unlock();

  if (in_turn) {
    AddToSum(push, indices);
  } else {
    std::vector<std::vector<float>>& slot = waiting_[rank];
    slot.resize(sizes_.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      slot[indices[i]].resize(sizes_[indices[i]]);
      DecodeTensor(push.gradients(static_cast<int>(i)), slot[indices[i]]);
    }
  }

  absl::MutexLock lock(&mu_);
  if (in_turn) {
    slots_[rank] = Slot::kSummed;
    next_ = rank + 1;
    summing_ = false;
  } else {
    slots_[rank] = Slot::kWaiting;
  }
  // The thread whose rank the summer was waiting for, or the summer itself,
  // carries the prefix on; one that arrives while another sums leaves its
  // slot to that one, which looks again before it stops.
  if (!summing_) SumWaitingPrefix();
}

void StepAggregate::SumWaitingPrefix() {
  summing_ = true;
  while (next_ < num_workers_ && slots_[next_] == Slot::kWaiting) {
    const int rank = next_;
    mu_.Unlock();
    for (size_t v = 0; v < sum_.size(); ++v) {
      sum_[v].resize(sizes_[v]);
      Accumulate(sum_[v].data(), waiting_[rank][v].data(), sum_[v].size(), !sum_started_);
    }
    sum_started_ = true;
    mu_.Lock();
    slots_[rank] = Slot::kSummed;
    ++next_;
  }
  summing_ = false;
}

int StepAggregate::landed() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](Slot s) {
    return s == Slot::kWaiting || s == Slot::kSummed;
  }));
}

int StepAggregate::LandedLocked() const {
  int landed = 0;
  for (Slot s : slots_) landed += (s == Slot::kWaiting || s == Slot::kSummed) ? 1 : 0;
  return landed;
}

void StepAggregate::PartsLocked(size_t v, std::vector<std::span<const float>>* parts) const {
  // The sum so far (never -0, so 0 + sum is the sum), then the ranks that
  // waited, in rank order: the same additions as summing them one by one.
  parts->clear();
  if (sum_started_) parts->push_back(sum_[v]);
  for (int rank = next_; rank < num_workers_; ++rank) {
    if (slots_[rank] == Slot::kWaiting) parts->push_back(waiting_[rank][v]);
  }
}

double StepAggregate::SquaredNormOfMean() {
  absl::MutexLock lock(&mu_);
  const int landed = LandedLocked();
  if (landed == 0) return 0.0;
  const float scale = 1.0f / static_cast<float>(landed);
  std::vector<std::span<const float>> gradients;
  double sum = 0.0;
  for (size_t v = 0; v < sizes_.size(); ++v) {
    PartsLocked(v, &gradients);
    sum += SquaredNormOfScaledSum(gradients, scale, sizes_[v]);
  }
  return sum;
}

absl::Status StepAggregate::Stage(VariableStore* store, const UpdateSettings& settings,
                                  ThreadPool* threads, int parts) {
  absl::MutexLock lock(&mu_);
  const int landed = LandedLocked();
  if (landed == 0) {
    return absl::InternalError("a SYNC step completed with no gradient in it");
  }
  const float scale = 1.0f / static_cast<float>(landed);
  absl::Status staged = absl::OkStatus();
  std::vector<std::span<const float>> gradients;
  for (size_t v = 0; v < sizes_.size() && staged.ok(); ++v) {
    PartsLocked(v, &gradients);
    staged = StageMean(store, static_cast<int>(v), gradients, scale, settings, threads, parts);
  }
  std::fill(slots_.begin(), slots_.end(), Slot::kEmpty);
  next_ = 0;
  sum_started_ = false;
  return staged;
}

}  // namespace pst
