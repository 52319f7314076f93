// A click-through-rate model (wide & deep) on a Kernels backend:
//   - deep: every categorical field's ids are looked up in one embedding
//     table (dim D) and pooled per field (sum or mean, kernels/
//     embedding_bags.h); the F pooled vectors and the dense features form
//     the input [F*D + dense] of an MLP (worker/model/mlp.h) with one output;
//   - wide (optional): every id's weight in a dim-1 table, summed per
//     example (times the id's value), added to the MLP's output;
//   - the output is a logit; the loss is the sigmoid log-loss.
// The dense variables are the MLP's; the embedding rows live on the PS and
// come in per step for the batch's unique ids only (CtrStepInput), and
// their gradients go back aggregated per unique id.
#ifndef PST_WORKER_MODEL_CTR_MODEL_H_
#define PST_WORKER_MODEL_CTR_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "data/ctr_batch.h"
#include "kernels/embedding_bags.h"
#include "kernels/kernels.h"
#include "worker/model/mlp.h"

namespace pst {

struct CtrModelSpec {
  int num_fields = 0;
  int dense_dim = 0;
  int embedding_dim = 0;
  PoolingKind pooling = PoolingKind::kSum;
  bool wide = false;
  std::vector<int> hidden;
  ActivationKind activation = ActivationKind::kRelu;

  int input_dim() const { return num_fields * embedding_dim + dense_dim; }
};

// A batch made ready for the model: the unique ids its bags read, in order
// of first appearance (the rows to pull, row i for unique_ids[i]), and its
// bags over those rows.
struct CtrStepInput {
  std::vector<uint64_t> unique_ids;
  EmbeddingBags deep;  // one bag per (example, field), into the MLP's input rows
  EmbeddingBags wide;  // one bag per example over all its ids, summed
};
// InvalidArgument when the batch's shape is not the spec's.
absl::Status PrepareCtrInput(const CtrBatch& batch, const CtrModelSpec& spec,
                             CtrStepInput* input);

class CtrModel {
 public:
  // `kernels` must outlive the model. InvalidArgument for a bad spec.
  static absl::StatusOr<std::unique_ptr<CtrModel>> Create(const CtrModelSpec& spec,
                                                          Kernels* kernels, int max_batch);
  ~CtrModel();
  CtrModel(const CtrModel&) = delete;
  CtrModel& operator=(const CtrModel&) = delete;

  const CtrModelSpec& spec() const { return spec_; }
  // The dense variables (the MLP's), their values and gradients as Mlp's.
  Mlp& mlp() { return *mlp_; }
  const Mlp& mlp() const { return *mlp_; }

  // Forward and backward on `batch`, prepared as `input`. `rows` holds the
  // embedding rows of input.unique_ids ([unique, D]) and `wide_rows` their
  // wide weights ([unique], empty without the wide part), host memory.
  // Leaves d(mean loss)/d(variable) in mlp().HostGradient and
  // d(mean loss)/d(row) in `row_grads` and `wide_grads` (shaped like
  // `rows` and `wide_rows`).
  absl::StatusOr<LossResult> ComputeGradients(const CtrBatch& batch, const CtrStepInput& input,
                                              std::span<const float> rows,
                                              std::span<const float> wide_rows,
                                              std::span<float> row_grads,
                                              std::span<float> wide_grads);

  // Forward only: the loss, and each example's click probability in
  // `probabilities` ([batch]).
  absl::StatusOr<LossResult> Evaluate(const CtrBatch& batch, const CtrStepInput& input,
                                      std::span<const float> rows,
                                      std::span<const float> wide_rows,
                                      std::span<float> probabilities);

 private:
  CtrModel(CtrModelSpec spec, Kernels* kernels, int max_batch);
  // The MLP's input and the wide logits for `batch`, queued.
  absl::Status QueueInput(const CtrBatch& batch, const CtrStepInput& input,
                          std::span<const float> rows, std::span<const float> wide_rows);
  absl::Status CheckShapes(const CtrBatch& batch, const CtrStepInput& input,
                           std::span<const float> rows, std::span<const float> wide_rows) const;
  // A backend buffer of at least `count` floats in *buffer (grown as needed);
  // on a host backend, `host` itself.
  absl::StatusOr<float*> Staged(float** buffer, size_t* capacity, size_t count);

  CtrModelSpec spec_;
  Kernels* kernels_;
  int max_batch_;
  std::unique_ptr<Mlp> mlp_;
  float* wide_logits_ = nullptr;  // [max_batch]
  // Backend copies of the step's rows and their gradients (a GPU's; a
  // host backend computes on the caller's spans).
  float* rows_ = nullptr;
  size_t rows_capacity_ = 0;
  float* row_grads_ = nullptr;
  size_t row_grads_capacity_ = 0;
  float* wide_rows_ = nullptr;
  size_t wide_rows_capacity_ = 0;
  float* wide_grads_ = nullptr;
  size_t wide_grads_capacity_ = 0;
};

}  // namespace pst

#endif  // PST_WORKER_MODEL_CTR_MODEL_H_
