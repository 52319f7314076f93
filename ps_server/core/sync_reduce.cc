#include "ps_server/core/sync_reduce.h"

#include <algorithm>
#include <array>

namespace pst {
namespace {

// Elements reduced at a time: the block's sum stays in L1 while the
// optimizer stages it.
constexpr size_t kReduceBlock = 2048;

// The mean of elements [first, first + len) into `mean`: 0 + g_0 + g_1 +
// ..., times `scale`; one function, so that the clipping's norm measures
// bitwise the mean that is staged.
void MeanOfBlock(const std::vector<std::span<const float>>& gradients, float scale, size_t first,
                 size_t len, float* __restrict mean) {
  std::fill(mean, mean + len, 0.0f);
  for (std::span<const float> g : gradients) {
    const float* __restrict part = g.data() + first;
    for (size_t i = 0; i < len; ++i) mean[i] += part[i];
  }
  for (size_t i = 0; i < len; ++i) mean[i] *= scale;
}

// Reduces and stages elements [begin, end).
void StageRange(VariableStore::StageTarget* target,
                const std::vector<std::span<const float>>& gradients, float scale, size_t begin,
                size_t end) {
  std::array<float, kReduceBlock> mean;
  for (size_t first = begin; first < end; first += kReduceBlock) {
    const size_t len = std::min(kReduceBlock, end - first);
    MeanOfBlock(gradients, scale, first, len, mean.data());
    target->Apply(first, {mean.data(), len});
  }
}

}  // namespace

double SquaredNormOfScaledSum(const std::vector<std::span<const float>>& gradients, float scale,
                              size_t size) {
  std::array<float, kReduceBlock> mean;
  double norm = 0.0;
  for (size_t first = 0; first < size; first += kReduceBlock) {
    const size_t len = std::min(kReduceBlock, size - first);
    MeanOfBlock(gradients, scale, first, len, mean.data());
    for (size_t i = 0; i < len; ++i) norm += static_cast<double>(mean[i]) * mean[i];
  }
  return norm;
}

void StageInParts(VariableStore::StageTarget* target, size_t n, size_t block, ThreadPool* threads,
                  int parts,
                  absl::FunctionRef<void(VariableStore::StageTarget*, size_t, size_t)> stage) {
  parts = n < kParallelElements ? 1 : std::max(1, parts);
  // Whole blocks per part, so that the split does not change the blocks.
  const size_t blocks = (n + block - 1) / block;
  const size_t per_part = (blocks + parts - 1) / parts * block;
  std::vector<VariableStore::StageTarget> part_targets(parts - 1, *target);
  {
    std::vector<ThreadPool::Task> tasks;
    for (int p = 1; p < parts; ++p) {
      const size_t begin = std::min(n, p * per_part);
      const size_t end = std::min(n, (p + 1) * per_part);
      tasks.push_back(
          threads->Start([&, p, begin, end] { stage(&part_targets[p - 1], begin, end); }));
    }
    stage(target, 0, std::min(n, per_part));
  }  // the tasks' destructors wait for them
  for (const VariableStore::StageTarget& part : part_targets) target->Merge(part);
}

absl::Status StageMean(VariableStore* store, int index,
                       const std::vector<std::span<const float>>& gradients, float scale,
                       const UpdateSettings& settings, ThreadPool* threads, int parts) {
  absl::StatusOr<VariableStore::StageTarget> target = store->BeginStage(index, settings);
  if (!target.ok()) return target.status();
  StageInParts(&*target, store->variable(index).size(), kReduceBlock, threads, parts,
               [&](VariableStore::StageTarget* part, size_t begin, size_t end) {
                 StageRange(part, gradients, scale, begin, end);
               });
  return store->FinishStage(index, *target);
}

}  // namespace pst
