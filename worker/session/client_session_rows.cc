// ClientSession's embedding-table calls (worker/session/client_session.h).
#include "absl/strings/str_cat.h"
#include "common/embedding_config.h"
#include "common/optimizer_config.h"
#include "common/status_macros.h"
#include "worker/session/client_session.h"

namespace pst {

absl::Status ClientSession::DeclareTables(const std::vector<std::pair<std::string, int>>& tables,
                                          const OptimizerConfig* optimizer) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("declare_tables"));
  if (declared()) {
    return absl::FailedPreconditionError(
        "embedding tables are declared before the model's variables (declare_tables, then init)");
  }
  google::protobuf::RepeatedPtrField<EmbeddingTableConfig> all(
      client_->embedding_tables().begin(), client_->embedding_tables().end());
  for (const auto& [name, dim] : tables) {
    EmbeddingTableConfig* table = all.Add();
    table->set_name(name);
    table->set_dim(dim);
    if (optimizer != nullptr) *table->mutable_optimizer() = *optimizer;
  }
  // Checked as the shards will check them; without their own optimizer
  // they take the job's.
  PST_RETURN_IF_ERROR(ResolveEmbeddingTables(all, config_.training().optimizer()).status());
  client_->SetEmbeddingTables({all.begin(), all.end()});
  return absl::OkStatus();
}

absl::StatusOr<bool> ClientSession::InitWithRows(const std::vector<std::span<const float>>& values,
                                                 std::span<const RowGradients> rows) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("init"));
  PST_RETURN_IF_ERROR(CheckDeclared(values.size()));
  return client_->Init(values, rows);
}

absl::Status ClientSession::SetDenseOptimizer(const OptimizerConfig& optimizer) {
  PST_RETURN_IF_ERROR(ResolveOptimizerConfig(optimizer).status());
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("set_optimizer"));
  client_->SetDenseOptimizer(optimizer);
  return absl::OkStatus();
}

absl::Status ClientSession::SetUpdateRates(const std::optional<UpdateRates>& rates) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("set_rates"));
  if (!declared()) {
    return absl::FailedPreconditionError("rates are set after the model is declared (declare, then set_rates)");
  }
  return client_->SetUpdateRates(rates);
}

std::vector<EmbeddingTableConfig> ClientSession::tables() const {
  absl::MutexLock lock(&mu_);
  return client_->embedding_tables();
}

absl::Status ClientSession::PullRows(std::span<const RowValues> rows) {
  absl::MutexLock lock(&mu_);
  TrainingSession* session = session_.get();  // for the lambda, run under this lock
  return session->Redo([&] { return session->Exchange({.pull_rows = rows}); });
}

absl::Status ClientSession::PushRows(std::span<const RowGradients> rows) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("push_rows"));
  return PushStep({.push_rows = rows});
}

absl::Status ClientSession::PushPullRows(const std::vector<std::span<const float>>& gradients,
                                         const std::vector<std::span<float>>& out,
                                         const StepRows& rows) {
  absl::MutexLock lock(&mu_);
  PST_RETURN_IF_ERROR(CheckNotEnded("push_pull_rows"));
  PST_RETURN_IF_ERROR(CheckDeclared(gradients.size()));
  PST_RETURN_IF_ERROR(CheckDeclared(out.size()));
  return PushStep(
      {.gradients = &gradients, .push_rows = rows.push, .values = &out, .pull_rows = rows.pull});
}

}  // namespace pst
