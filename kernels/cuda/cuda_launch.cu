// The elementwise and reduction kernels of the CUDA backend (see
// cuda_launch.h). Matrix products are not here: they go to cuBLAS.
//
// The loss kernels follow the CPU reference formula for formula (exp and the
// per-row sums in double, the same float expressions for the gradients), so
// the two backends agree to float rounding.
#include <climits>
#include <cmath>

#include "kernels/column_sums.h"
#include "kernels/cuda/cuda_launch.h"

namespace pst::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

unsigned BlocksFor(size_t count, size_t cap) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

// Elementwise grids: enough blocks to fill a GPU, grid-stride beyond that.
unsigned ElementwiseBlocks(size_t count) { return BlocksFor(count, 1u << 16); }

__global__ void ScaleKernel(size_t count, float beta, float* c) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    c[i] *= beta;
  }
}

__global__ void AddBiasKernel(size_t count, int cols, const float* bias, float* y) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

__global__ void ActivationForwardKernel(bool use_tanh, size_t count, float* y) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const float v = y[i];
    y[i] = use_tanh ? tanhf(v) : (v > 0.0f ? v : 0.0f);
  }
}

__global__ void ActivationBackwardKernel(bool use_tanh, size_t count, const float* y, float* dy) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const float v = y[i];
    if (use_tanh) {
      dy[i] *= 1.0f - v * v;
    } else if (!(v > 0.0f)) {
      dy[i] = 0.0f;
    }
  }
}

// Step 1 and 2 of kernels/column_sums.h. Block (kColumnSumsTileCols,
// kColumnSumsRowLanes) at (column tile x, row block y): thread (x, y) sums
// lane y of its column over the block's rows (loads coalesced across x),
// then row 0 of the block adds the lanes in order. `sums` is out itself when
// there is one row block, else the row_blocks x cols partial sums.
__global__ void ColumnSumsBlockKernel(int rows, int cols, long long rows_per_block,
                                      const float* m, float* sums) {
  __shared__ float lanes[kColumnSumsRowLanes][kColumnSumsTileCols + 1];
  const int col = blockIdx.x * kColumnSumsTileCols + threadIdx.x;
  const long long first = blockIdx.y * rows_per_block;
  const long long end = first + rows_per_block < rows ? first + rows_per_block : rows;
  float sum = 0.0f;
  if (col < cols) {
    for (long long r = first + threadIdx.y; r < end; r += kColumnSumsRowLanes) {
      sum += m[static_cast<size_t>(r) * cols + col];
    }
  }
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int y = 0; y < kColumnSumsRowLanes; ++y) total += lanes[y][threadIdx.x];
    sums[static_cast<size_t>(blockIdx.y) * cols + col] = total;
  }
}

// Step 3: one thread per column adds the row blocks' sums in block order.
__global__ void ColumnSumsFinishKernel(long long row_blocks, int cols, const float* partials,
                                       float* out) {
  const long long col = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (long long b = 0; b < row_blocks; ++b) total += partials[static_cast<size_t>(b) * cols + col];
  out[col] = total;
}

// The largest value and its first index among the warp's candidates
// (index -1 = none); the result is valid in lane 0.
__device__ void WarpArgmax(float* value, int* index) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_down_sync(kFullMask, *value, offset);
    const int other_index = __shfl_down_sync(kFullMask, *index, offset);
    const bool take = other_index >= 0 &&
                      (*index < 0 || other > *value || (other == *value && other_index < *index));
    if (take) {
      *value = other;
      *index = other_index;
    }
  }
}

// Sum over the warp, valid in lane 0 (a fixed order, unlike a butterfly).
__device__ double WarpSum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset);
  return v;
}

// One warp per row. Lane 0 of each warp keeps its rows' loss and correct
// count; the block adds its warps' shares in warp order into partials.
__global__ void SoftmaxCrossEntropyKernel(int rows, int classes, const float* logits,
                                          const float* labels, float* dlogits,
                                          LossPartial* partials) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float inv_rows = 1.0f / static_cast<float>(rows);
  double loss = 0.0;
  long long correct = 0;
  int first_bad = INT_MAX;
  for (int r = blockIdx.x * kWarpsPerBlock + warp; r < rows; r += gridDim.x * kWarpsPerBlock) {
    const float* z = logits + static_cast<size_t>(r) * classes;
    float best = 0.0f;
    int best_index = -1;
    for (int c = lane; c < classes; c += 32) {
      if (best_index < 0 || z[c] > best) {
        best = z[c];
        best_index = c;
      }
    }
    WarpArgmax(&best, &best_index);
    const float max = __shfl_sync(kFullMask, best, 0);
    const int argmax = __shfl_sync(kFullMask, best_index, 0);
    double sum = 0.0;
    for (int c = lane; c < classes; c += 32) sum += exp(static_cast<double>(z[c] - max));
    sum = __shfl_sync(kFullMask, WarpSum(sum), 0);
    // Every lane reads the same label, so the whole warp takes one branch.
    const float label_value = labels[r];
    const bool valid = label_value >= 0.0f && label_value < static_cast<float>(classes) &&
                       truncf(label_value) == label_value;
    if (!valid) {
      first_bad = min(first_bad, r);
      continue;
    }
    const int label = static_cast<int>(label_value);
    if (lane == 0) {
      loss += log(sum) - static_cast<double>(z[label] - max);
      correct += argmax == label ? 1 : 0;
    }
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<size_t>(r) * classes;
      const double inv_sum = 1.0 / sum;
      for (int c = lane; c < classes; c += 32) {
        const float p = static_cast<float>(exp(static_cast<double>(z[c] - max)) * inv_sum);
        d[c] = (p - (c == label ? 1.0f : 0.0f)) * inv_rows;
      }
    }
  }
  __shared__ LossPartial warp_share[kWarpsPerBlock];
  if (lane == 0) warp_share[warp] = LossPartial{loss, correct, first_bad};
  __syncthreads();
  if (threadIdx.x == 0) {
    LossPartial total{0.0, 0, INT_MAX};
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      total.loss_sum += warp_share[w].loss_sum;
      total.correct += warp_share[w].correct;
      total.first_bad_row = min(total.first_bad_row, warp_share[w].first_bad_row);
    }
    partials[blockIdx.x] = total;
  }
}

// Each thread sums its elements' squared differences; the block adds them
// by a fixed tree.
__global__ void SquaredErrorKernel(size_t count, const float* pred, const float* target,
                                   float* dpred, LossPartial* partials) {
  const float scale = 2.0f / static_cast<float>(count);
  double sum = 0.0;
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * kThreads) {
    const float diff = pred[i] - target[i];
    sum += static_cast<double>(diff) * diff;
    if (dpred != nullptr) dpred[i] = scale * diff;
  }
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = LossPartial{shared[0], 0, INT_MAX};
}

// One thread adds the blocks' partials in block order.
__global__ void FinishLossKernel(int blocks, const LossPartial* partials, const float* labels,
                                 LossTotals* totals) {
  LossTotals t{0.0, 0, INT_MAX, 0.0f};
  for (int b = 0; b < blocks; ++b) {
    t.loss_sum += partials[b].loss_sum;
    t.correct += partials[b].correct;
    t.first_bad_row = min(t.first_bad_row, partials[b].first_bad_row);
  }
  if (t.first_bad_row != INT_MAX && labels != nullptr) t.bad_label = labels[t.first_bad_row];
  *totals = t;
}

// One thread per row, as SquaredErrorKernel; the loss in double, the
// gradient by the CPU reference's float expression.
__global__ void SigmoidCrossEntropyKernel(int rows, const float* logits, const float* labels,
                                          float* dlogits, LossPartial* partials) {
  const float inv_rows = 1.0f / static_cast<float>(rows);
  double loss = 0.0;
  long long correct = 0;
  for (int r = blockIdx.x * kThreads + threadIdx.x; r < rows; r += gridDim.x * kThreads) {
    const double z = logits[r];
    const double y = labels[r];
    loss += fmax(z, 0.0) - y * z + log1p(exp(-fabs(z)));
    correct += (z > 0.0) == (y > 0.5) ? 1 : 0;
    if (dlogits != nullptr) {
      const float p = static_cast<float>(1.0 / (1.0 + exp(-z)));
      dlogits[r] = (p - labels[r]) * inv_rows;
    }
  }
  __shared__ double shared[kThreads];
  __shared__ long long shared_correct[kThreads];
  shared[threadIdx.x] = loss;
  shared_correct[threadIdx.x] = correct;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      shared[threadIdx.x] += shared[threadIdx.x + stride];
      shared_correct[threadIdx.x] += shared_correct[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = LossPartial{shared[0], shared_correct[0], INT_MAX};
}

__device__ float BagScale(const DeviceBags& b, int bag) {
  const int count = b.offsets[bag + 1] - b.offsets[bag];
  return b.mean && count > 0 ? 1.0f / static_cast<float>(count) : 1.0f;
}

__device__ long long BagOutput(const DeviceBags& b, int bag, int dim) {
  return static_cast<long long>(bag / b.bags_per_row) * b.row_stride +
         static_cast<long long>(bag % b.bags_per_row) * dim;
}

// Consecutive threads take consecutive elements of a bag, so the loads of
// a row are coalesced.
__global__ void PoolBagsKernel(DeviceBags b, int dim, const float* rows, float* out) {
  const size_t count = static_cast<size_t>(b.bags) * dim;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const int bag = static_cast<int>(i / dim);
    const int j = static_cast<int>(i % dim);
    float sum = 0.0f;
    for (int e = b.offsets[bag]; e < b.offsets[bag + 1]; ++e) {
      sum += b.weights[e] * rows[static_cast<size_t>(b.slots[e]) * dim + j];
    }
    const float scale = BagScale(b, bag);
    out[BagOutput(b, bag, dim) + j] = scale != 1.0f ? sum * scale : sum;
  }
}

// Each (row, element) sums the entries that read the row: no two threads
// write one place, so no atomics, and the order is the reference's.
__global__ void PoolBagsBackwardKernel(DeviceBags b, int dim, const float* out_grad,
                                       float* row_grads) {
  const size_t count = static_cast<size_t>(b.rows) * dim;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    const int r = static_cast<int>(i / dim);
    const int j = static_cast<int>(i % dim);
    float sum = 0.0f;
    for (int k = b.row_offsets[r]; k < b.row_offsets[r + 1]; ++k) {
      const int e = b.row_entries[k];
      const int bag = b.entry_bags[e];
      sum += b.weights[e] * BagScale(b, bag) * out_grad[BagOutput(b, bag, dim) + j];
    }
    row_grads[i] = sum;
  }
}

}  // namespace

cudaError_t LaunchScale(cudaStream_t stream, size_t count, float beta, float* c) {
  if (count == 0) return cudaSuccess;
  ScaleKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(count, beta, c);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(cudaStream_t stream, int rows, int cols, const float* bias, float* y) {
  const size_t count = static_cast<size_t>(rows) * cols;
  if (count == 0) return cudaSuccess;
  AddBiasKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(count, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t LaunchActivationForward(cudaStream_t stream, bool tanh, size_t count, float* y) {
  if (count == 0) return cudaSuccess;
  ActivationForwardKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(tanh, count, y);
  return cudaGetLastError();
}

cudaError_t LaunchActivationBackward(cudaStream_t stream, bool tanh, size_t count,
                                     const float* y, float* dy) {
  if (count == 0) return cudaSuccess;
  ActivationBackwardKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(tanh, count, y, dy);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSums(cudaStream_t stream, int rows, int cols, const float* m, float* out,
                             float* scratch) {
  if (cols <= 0 || rows < 0) return cudaSuccess;
  const ColumnSumsPlan plan = PlanColumnSums(rows, cols);
  const dim3 block(kColumnSumsTileCols, kColumnSumsRowLanes);
  const dim3 grid(static_cast<unsigned>((cols + kColumnSumsTileCols - 1) / kColumnSumsTileCols),
                  static_cast<unsigned>(plan.row_blocks));
  float* sums = plan.row_blocks == 1 ? out : scratch;
  ColumnSumsBlockKernel<<<grid, block, 0, stream>>>(rows, cols, plan.rows_per_block, m, sums);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (plan.row_blocks == 1) return cudaSuccess;
  const unsigned finish_blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  ColumnSumsFinishKernel<<<finish_blocks, kThreads, 0, stream>>>(plan.row_blocks, cols, scratch,
                                                                 out);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(cudaStream_t stream, int rows, int classes,
                                      const float* logits, const float* labels, float* dlogits,
                                      LossPartial* partials, LossTotals* totals) {
  const size_t warps_needed = static_cast<size_t>(rows);
  const unsigned blocks = static_cast<unsigned>(
      (warps_needed + kWarpsPerBlock - 1) / kWarpsPerBlock < kMaxLossBlocks
          ? (warps_needed + kWarpsPerBlock - 1) / kWarpsPerBlock
          : kMaxLossBlocks);
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(rows, classes, logits, labels,
                                                             dlogits, partials);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  FinishLossKernel<<<1, 1, 0, stream>>>(static_cast<int>(blocks), partials, labels, totals);
  return cudaGetLastError();
}

cudaError_t LaunchSquaredError(cudaStream_t stream, size_t count, const float* pred,
                               const float* target, float* dpred, LossPartial* partials,
                               LossTotals* totals) {
  const unsigned blocks = BlocksFor(count, kMaxLossBlocks);
  SquaredErrorKernel<<<blocks, kThreads, 0, stream>>>(count, pred, target, dpred, partials);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  FinishLossKernel<<<1, 1, 0, stream>>>(static_cast<int>(blocks), partials, nullptr, totals);
  return cudaGetLastError();
}

cudaError_t LaunchSigmoidCrossEntropy(cudaStream_t stream, int rows, const float* logits,
                                      const float* labels, float* dlogits, LossPartial* partials,
                                      LossTotals* totals) {
  const unsigned blocks = BlocksFor(static_cast<size_t>(rows), kMaxLossBlocks);
  SigmoidCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(rows, logits, labels, dlogits,
                                                             partials);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  FinishLossKernel<<<1, 1, 0, stream>>>(static_cast<int>(blocks), partials, nullptr, totals);
  return cudaGetLastError();
}

cudaError_t LaunchPoolBags(cudaStream_t stream, const DeviceBags& bags, int dim, const float* rows,
                           float* out) {
  const size_t count = static_cast<size_t>(bags.bags) * dim;
  if (count == 0) return cudaSuccess;
  PoolBagsKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(bags, dim, rows, out);
  return cudaGetLastError();
}

cudaError_t LaunchPoolBagsBackward(cudaStream_t stream, const DeviceBags& bags, int dim,
                                   const float* out_grad, float* row_grads) {
  const size_t count = static_cast<size_t>(bags.rows) * dim;
  if (count == 0) return cudaSuccess;
  PoolBagsBackwardKernel<<<ElementwiseBlocks(count), kThreads, 0, stream>>>(bags, dim, out_grad,
                                                                            row_grads);
  return cudaGetLastError();
}

}  // namespace pst::cuda
