#include "ps_server/dense_table.h"

#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace pst {

DenseTable::DenseTable(std::unique_ptr<Optimizer> optimizer, int num_workers)
    : store_(std::move(optimizer)), step_(num_workers) {}

absl::Status DenseTable::Initialize(const InitRequest& request) {
  // A shard may hold rows of the model's tables and no dense variable.
  PST_RETURN_IF_ERROR(store_.Initialize(request.variables(), request.embeddings_size() > 0));
  ResetStep();
  return absl::OkStatus();
}

absl::Status DenseTable::CheckPush(const PushRequest& push, bool require_all, bool check_finite,
                                   TablePush* plan) const {
  return store_.ValidateGradients(push.gradients(), require_all, check_finite, &plan->indices);
}

absl::Status DenseTable::Stage(const PushRequest& push, const TablePush& plan, float lr_scale) {
  std::vector<float> scratch;
  for (size_t i = 0; i < plan.indices.size(); ++i) {
    PST_RETURN_IF_ERROR(store_.Stage(
        plan.indices[i], TensorValues(push.gradients(static_cast<int>(i)), &scratch), lr_scale));
  }
  return absl::OkStatus();
}

void DenseTable::Land(int rank, const PushRequest& push, const TablePush& plan) {
  step_.Land(rank, push, plan.indices);
}

absl::Status DenseTable::StageStep() { return step_.Stage(&store_, &threads_, parts_); }

absl::Status DenseTable::Restore(const ShardCheckpoint& checkpoint) {
  PST_RETURN_IF_ERROR(store_.Restore(checkpoint));
  ResetStep();
  return absl::OkStatus();
}

void DenseTable::AddStats(StatsResponse* response) const {
  response->set_variables(response->variables() + static_cast<int>(store_.size()));
  response->set_parameter_bytes(response->parameter_bytes() + store_.parameter_bytes());
}

void DenseTable::ResetStep() {
  std::vector<size_t> sizes(store_.size());
  for (size_t v = 0; v < sizes.size(); ++v) sizes[v] = store_.variable(static_cast<int>(v)).size();
  step_.Reset(std::move(sizes));
}

}  // namespace pst
