#include "ps_server/core/dense_table.h"

#include <cstdint>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "ps_server/core/sync_reduce.h"

namespace pst {

DenseTable::DenseTable(std::unique_ptr<Optimizer> optimizer, int num_workers)
    : store_(std::move(optimizer)), step_(num_workers) {}

absl::Status DenseTable::Initialize(const InitRequest& request) {
  // A shard may hold rows of the model's tables and no dense variable.
  PST_RETURN_IF_ERROR(store_.UseOptimizer(request.has_optimizer() ? &request.optimizer() : nullptr));
  PST_RETURN_IF_ERROR(store_.Initialize(request.variables(), request.embeddings_size() > 0));
  ResetStep();
  return absl::OkStatus();
}

absl::Status DenseTable::CheckPush(const PushRequest& push, bool require_all, bool check_finite,
                                   TablePush* plan) const {
  return store_.ValidateGradients(push.gradients(), require_all, check_finite, &plan->indices);
}

absl::Status DenseTable::Stage(const PushRequest& push, const TablePush& plan,
                               const UpdateSettings& settings) {
  std::vector<float> scratch;
  for (size_t i = 0; i < plan.indices.size(); ++i) {
    PST_RETURN_IF_ERROR(store_.Stage(
        plan.indices[i], TensorValues(push.gradients(static_cast<int>(i)), &scratch), settings));
  }
  return absl::OkStatus();
}

double DenseTable::SquaredNorm(const PushRequest& push, const TablePush& plan) const {
  std::vector<float> scratch;
  double sum = 0.0;
  for (size_t i = 0; i < plan.indices.size(); ++i) {
    for (float g : TensorValues(push.gradients(static_cast<int>(i)), &scratch)) {
      sum += static_cast<double>(g) * g;
    }
  }
  return sum;
}

void DenseTable::Land(int rank, const PushRequest& push, const TablePush& plan) {
  step_.Land(rank, push, plan.indices);
}

absl::Status DenseTable::StageStep(const UpdateSettings& settings) {
  return step_.Stage(&store_, settings, &threads_, parts_);
}

absl::Status DenseTable::Restore(const ShardCheckpoint& checkpoint) {
  PST_RETURN_IF_ERROR(store_.Restore(checkpoint));
  ResetStep();
  return absl::OkStatus();
}

absl::Status DenseTable::CheckSteps(const DenseSteps& steps) const {
  std::vector<bool> seen(store_.size(), false);
  for (const DenseStep& step : steps.steps()) {
    PST_RETURN_IF_ERROR(store_.CheckReplayed(step, &seen).status());
  }
  return absl::OkStatus();
}

absl::Status DenseTable::ApplySteps(const DenseSteps& steps) {
  std::vector<float> copy;
  for (const DenseStep& step : steps.steps()) {
    const int index = store_.Find(step.name());
    VariableStore::StageTarget target = store_.BeginReplayed(index, step);
    // The gradient's bytes where they lie (a parsed string's buffer is
    // aligned), copied only where they are not.
    const size_t n = step.gradient().size() / sizeof(float);
    const float* data = reinterpret_cast<const float*>(step.gradient().data());
    if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0) {
      copy.resize(n);
      std::memcpy(copy.data(), step.gradient().data(), step.gradient().size());
      data = copy.data();
    }
    const std::span<const float> gradient(data, n);
    // Each element's result depends only on its own inputs
    // (Optimizer::ApplyRange), so the split does not change a bit.
    StageInParts(&target, n, /*block=*/1, &threads_, parts_,
                 [&](VariableStore::StageTarget* part, size_t begin, size_t end) {
                   part->Apply(begin, gradient.subspan(begin, end - begin));
                 });
    if (absl::Status finished = store_.FinishStage(index, target); !finished.ok()) {
      store_.Discard();
      return finished;
    }
  }
  store_.Commit();
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

absl::StatusOr<std::vector<const Variable*>> DenseTable::Select(const PullRequest& pull,
                                                                 int shard) const {
  std::vector<const Variable*> variables;
  if (pull.rows_only()) {
    if (!pull.names().empty()) {
      return absl::InvalidArgumentError("a pull of rows only names dense variables too");
    }
    return variables;
  }
  if (pull.names().empty()) {
    for (size_t i = 0; i < store_.size(); ++i) variables.push_back(&store_.variable(static_cast<int>(i)));
    return variables;
  }
  // Each variable once: a request of a few bytes per name must not make the
  // answer many copies of the shard.
  std::vector<bool> seen(store_.size(), false);
  for (const std::string& name : pull.names()) {
    const int index = store_.Find(name);
    if (index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown variable \"", name, "\" in a pull from shard ", shard));
    }
    if (seen[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("a pull names variable \"", name, "\" twice; name each variable once"));
    }
    seen[index] = true;
    variables.push_back(&store_.variable(index));
  }
  return variables;
}

absl::Status DenseTable::CheckStreamHeader(const PushRequest& header, bool require_all,
                                           std::vector<int>* indices,
                                           std::vector<int64_t>* bytes) const {
  std::vector<bool> seen(store_.size(), false);
  for (const Tensor& gradient : header.gradients()) {
    PST_ASSIGN_OR_RETURN(const int index, store_.CheckGradientHeader(gradient, &seen));
    const int element_bytes = DTypeBytes(gradient.dtype());
    if (element_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for \"", gradient.name(), "\" has unknown dtype ",
                       static_cast<int>(gradient.dtype()), "; use FLOAT32, FLOAT16 or BFLOAT16"));
    }
    bytes->push_back(static_cast<int64_t>(store_.variable(index).size()) * element_bytes);
    indices->push_back(index);
  }
  return require_all ? store_.CheckEveryVariableSeen(seen) : absl::OkStatus();
}

}  // namespace pst
