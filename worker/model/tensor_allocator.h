// Where a model keeps the tensors it computes on.
//
// A model (worker/model/mlp.h, worker/model/towers.h) keeps its parameters and
// gradients in memory of its own until it is given an allocator: it then
// asks it for each variable's memory, moves its values there and computes
// there from then on. A caller whose exchange reads gradients and writes
// parameters where they lie (a co-located shard's shared region) hands the
// model an allocator over that memory, so that a step copies nothing
// between the model and the exchange; the model knows nothing of where the
// memory comes from.
#ifndef PST_WORKER_MODEL_TENSOR_ALLOCATOR_H_
#define PST_WORKER_MODEL_TENSOR_ALLOCATOR_H_

#include <span>

#include "absl/status/statusor.h"
#include "placement/variable_spec.h"

namespace pst {

class TensorAllocator {
 public:
  // One variable's memory: its values and its gradient, each as many
  // floats as the variable has.
  struct Memory {
    std::span<float> values;
    std::span<float> gradient;
  };
  virtual ~TensorAllocator() = default;
  // The memory of the model's variable number `index`, `spec` its name and
  // shape; called once per variable, in the model's order. It must stay
  // valid, at the same address, for as long as the model lives.
  virtual absl::StatusOr<Memory> Allocate(int index, const VariableSpec& spec) = 0;
};

}  // namespace pst

#endif  // PST_WORKER_MODEL_TENSOR_ALLOCATOR_H_
