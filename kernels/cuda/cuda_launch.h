// The small CUDA kernels behind CudaKernels, as plain launch functions (the
// .cu file holds no Abseil or project types, so nvcc compiles only this).
//
// Every function queues its kernel(s) on `stream` and returns the launch
// error (cudaGetLastError), cudaSuccess when the launch was accepted.
// Reductions are deterministic: fixed grids and fixed summation orders, so a
// step gives bitwise the same loss on the same GPU every time.
#ifndef PST_KERNELS_CUDA_CUDA_LAUNCH_H_
#define PST_KERNELS_CUDA_CUDA_LAUNCH_H_

#include <cstddef>

#include <cuda_runtime_api.h>

namespace pst::cuda {

// Upper bound on the blocks of a loss kernel: the size of the per-block
// partial-result buffer the caller provides.
inline constexpr int kMaxLossBlocks = 128;

// One block's share of a loss reduction.
struct LossPartial {
  double loss_sum;
  long long correct;
  int first_bad_row;  // INT_MAX when every label was a class index
};

// The whole batch's reduction, read back by the host once per loss call.
struct LossTotals {
  double loss_sum;
  long long correct;
  int first_bad_row;  // INT_MAX when every label was a class index
  float bad_label;    // labels[first_bad_row] when there is one
};

// c[i] *= beta (beta != 0), for Gemm with k == 0.
cudaError_t LaunchScale(cudaStream_t stream, size_t count, float beta, float* c);

// y[r, c] += bias[c].
cudaError_t LaunchAddBias(cudaStream_t stream, int rows, int cols, const float* bias, float* y);

// tanh when `tanh` is true, else ReLU; in place.
cudaError_t LaunchActivationForward(cudaStream_t stream, bool tanh, size_t count, float* y);

// dy *= f'(x), written through the forward output y.
cudaError_t LaunchActivationBackward(cudaStream_t stream, bool tanh, size_t count,
                                     const float* y, float* dy);

// out[c] = sum over r of m[r, c], in the order of kernels/column_sums.h
// (bitwise what ColumnSumsReference gives). `scratch` holds
// kColumnSumsScratch floats of device memory.
cudaError_t LaunchColumnSums(cudaStream_t stream, int rows, int cols, const float* m, float* out,
                             float* scratch);

// Softmax cross-entropy over rows (labels as float class indices), writing
// dlogits = (softmax - onehot) / rows when dlogits is not null, and the sums
// into *totals (device memory). `partials` holds kMaxLossBlocks entries.
cudaError_t LaunchSoftmaxCrossEntropy(cudaStream_t stream, int rows, int classes,
                                      const float* logits, const float* labels, float* dlogits,
                                      LossPartial* partials, LossTotals* totals);

// Sum of squared differences over `count` elements into *totals, writing
// dpred = 2 (pred - target) / count when dpred is not null.
cudaError_t LaunchSquaredError(cudaStream_t stream, size_t count, const float* pred,
                               const float* target, float* dpred, LossPartial* partials,
                               LossTotals* totals);

// Sigmoid cross-entropy of one logit per row into *totals (loss sum and
// the rows whose sign matches the label), writing dlogits =
// (sigmoid - label) / rows when dlogits is not null.
cudaError_t LaunchSigmoidCrossEntropy(cudaStream_t stream, int rows, const float* logits,
                                      const float* labels, float* dlogits, LossPartial* partials,
                                      LossTotals* totals);

// A finished EmbeddingBags (kernels/embedding_bags.h) in device memory;
// row_stride resolved (never 0).
struct DeviceBags {
  int bags;
  int rows;
  int bags_per_row;
  long long row_stride;
  bool mean;
  const int* offsets;      // [bags + 1]
  const int* slots;        // [entries]
  const float* weights;    // [entries]
  const int* row_offsets;  // [rows + 1]
  const int* row_entries;  // [entries]
  const int* entry_bags;   // [entries]
};

// PoolBagsOnHost and PoolBagsBackwardOnHost: one thread per (bag, element)
// and per (row, element), each summing its entries in the reference's
// order.
cudaError_t LaunchPoolBags(cudaStream_t stream, const DeviceBags& bags, int dim, const float* rows,
                           float* out);
cudaError_t LaunchPoolBagsBackward(cudaStream_t stream, const DeviceBags& bags, int dim,
                                   const float* out_grad, float* row_grads);

}  // namespace pst::cuda

#endif  // PST_KERNELS_CUDA_CUDA_LAUNCH_H_
