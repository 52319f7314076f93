// Training data: Fashion-MNIST from its IDX .gz files, and the classic
// tutorial problems generated in memory.
#ifndef PST_WORKER_TRAINING_DATASET_H_
#define PST_WORKER_TRAINING_DATASET_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pst {

// Examples stored densely: features is [size, feature_dim]; targets is
// [size] class indices (as floats) when num_classes > 0, otherwise
// [size, target_dim] regression targets.
struct Dataset {
  std::string name;
  int64_t size = 0;
  int feature_dim = 0;
  int target_dim = 1;
  int num_classes = 0;  // 0 = regression
  std::vector<float> features;
  std::vector<float> targets;
};

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. Pixels are
// scaled to [0, 1]. `limit` > 0 keeps only the first `limit` examples.
// NotFound names the missing file; InvalidArgument names a malformed one.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train, int64_t limit = 0);

// y = 5x^2 + 3 with x uniform on [-1, 1]; features [x^2, x, 1].
Dataset MakeQuadratic(int64_t examples, uint64_t seed);
// y = x^2 with x uniform on [-2, 2]; feature [x].
Dataset MakeParabola(int64_t examples, uint64_t seed);
// y = w.x + b + noise * N(0, 1), x ~ N(0, 1)^features; w, b fixed by seed.
Dataset MakeLinearRegression(int64_t examples, int features, float noise, uint64_t seed);

// Decides which examples worker `rank` of `num_workers` trains on.
//
// Every epoch all examples are permuted with a generator seeded from
// (seed, epoch), identically on every worker. Global step s of the epoch
// covers permuted positions [s*N*b, (s+1)*N*b), and worker r takes the r-th
// block of b of them. So the workers read disjoint data, the data is
// reshuffled every epoch, and the union of the N workers' batches at a step
// is exactly the batch one worker with batch N*b would read: that is what
// makes SYNC with N workers equal to one worker with the combined batch.
// The last size % (N*b) examples of each permutation are skipped that epoch.
class ShardSampler {
 public:
  ShardSampler(int64_t dataset_size, int rank, int num_workers, int batch_size, uint64_t seed);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // The example indices of this worker's batch `step` (0-based) of `epoch`.
  // Computes the epoch's permutation when the epoch changes.
  std::span<const int64_t> Batch(int epoch, int64_t step);

 private:
  int64_t dataset_size_;
  int rank_;
  int num_workers_;
  int batch_size_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  int current_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// Copies the rows `indices` of `data` into x ([n, feature_dim]) and
// targets ([n, target_dim]).
void GatherBatch(const Dataset& data, std::span<const int64_t> indices, float* x,
                 float* targets);

}  // namespace pst

#endif  // PST_WORKER_TRAINING_DATASET_H_
