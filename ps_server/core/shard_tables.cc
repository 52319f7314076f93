#include "ps_server/core/shard_tables.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps_server/core/model_share.h"
#include "spdlog/spdlog.h"

namespace pst {

ShardTables::ShardTables(const ShardOptions& options, std::unique_ptr<Optimizer> optimizer)
    : shard_(options.shard),
      model_share_(options.model ? std::optional(ShardShare(*options.model, options.shard,
                                                            options.num_shards))
                                 : std::nullopt),
      embeddings_(new EmbeddingTable({.shard = options.shard,
                                      .num_shards = options.num_shards,
                                      .num_workers = options.num_workers,
                                      .seed = options.seed,
                                      .optimizer = options.optimizer,
                                      .disk_fail_writes = nullptr,
                                      .replica = options.replica,
                                      .forward_changes = options.replicas > 1})),
      dense_(new DenseTable(std::move(optimizer), options.num_workers)) {
  tables_.push_back(std::unique_ptr<Table>(embeddings_));
  tables_.push_back(std::unique_ptr<Table>(dense_));
}

bool ShardTables::initialized() const {
  return std::all_of(tables_.begin(), tables_.end(),
                     [](const std::unique_ptr<Table>& table) { return table->initialized(); });
}

absl::Status ShardTables::Initialize(const InitRequest& request) {
  if (model_share_) PST_RETURN_IF_ERROR(CheckInitIsShare(request, *model_share_, shard_));
  for (const std::unique_ptr<Table>& table : tables_) {
    PST_RETURN_IF_ERROR(table->Initialize(request));
  }
  dense_bytes_ = dense_->parameter_bytes();
  RefreshParameterBytes();
  spdlog::info("shard {}: initialized {} variables ({} bytes) and {} embedding tables from "
               "worker:{}",
               shard_, dense_->store().size(), parameter_bytes(), request.embeddings_size(),
               request.worker());
  return absl::OkStatus();
}

absl::Status ShardTables::Restore(const ShardCheckpoint& checkpoint) {
  if (checkpoint.shard() != shard_) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint is of shard ",
                                                   checkpoint.shard(), ", this is shard ", shard_));
  }
  for (const std::unique_ptr<Table>& table : tables_) {
    PST_RETURN_IF_ERROR(table->Restore(checkpoint));
  }
  dense_bytes_ = dense_->parameter_bytes();
  RefreshParameterBytes();
  return absl::OkStatus();
}

absl::Status ShardTables::CheckPush(const PushRequest& push, bool require_all,
                                    PushChecked checked, std::vector<TablePush>* plans) const {
  if (push.has_rates()) PST_RETURN_IF_ERROR(CheckRates(push.rates()));
  plans->resize(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    const bool finite =
        tables_[t].get() == embeddings_ ? checked.rows_finite : checked.values_finite;
    PST_RETURN_IF_ERROR(
        tables_[t]->CheckPush(push, require_all, /*check_finite=*/!finite, &(*plans)[t]));
  }
  return absl::OkStatus();
}

absl::Status ShardTables::CheckRates(const UpdateRates& rates) const {
  for (const auto* rate_map : {&rates.learning_rates(), &rates.weight_decays()}) {
    for (const auto& [name, rate] : *rate_map) {
      if (dense_->store().Find(name) < 0 && !embeddings_->Holds(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the push gives a rate for \"", name, "\", which is no variable or table of shard ",
            shard_, "; name only what the shard holds"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ShardTables::Stage(const PushRequest& push, const std::vector<TablePush>& plans,
                                UpdateSettings settings, float clip_norm) {
  if (clip_norm > 0.0f) {
    double squared = 0.0;
    for (size_t t = 0; t < tables_.size(); ++t) squared += tables_[t]->SquaredNorm(push, plans[t]);
    settings.gradient_scale = ClipFactor(squared, clip_norm);
  }
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (absl::Status staged = tables_[t]->Stage(push, plans[t], settings); !staged.ok()) {
      Discard();
      return staged;
    }
  }
  return absl::OkStatus();
}

void ShardTables::Land(int rank, const PushRequest& push, const std::vector<TablePush>& plans) {
  for (size_t t = 0; t < tables_.size(); ++t) tables_[t]->Land(rank, push, plans[t]);
}

absl::Status ShardTables::StageStep(UpdateSettings settings, float clip_norm) {
  if (clip_norm > 0.0f) {
    double squared = 0.0;
    for (const std::unique_ptr<Table>& table : tables_) squared += table->StepSquaredNorm();
    settings.gradient_scale = ClipFactor(squared, clip_norm);
  }
  absl::Status staged = absl::OkStatus();
  for (const std::unique_ptr<Table>& table : tables_) {
    if (absl::Status s = table->StageStep(settings); staged.ok()) staged = s;
  }
  return staged;
}

void ShardTables::Commit() {
  for (const std::unique_ptr<Table>& table : tables_) table->Commit();
  RefreshParameterBytes();
}

void ShardTables::Discard() {
  for (const std::unique_ptr<Table>& table : tables_) table->Discard();
}

void ShardTables::Export(ShardCheckpoint* checkpoint) const {
  for (const std::unique_ptr<Table>& table : tables_) table->Export(checkpoint);
}

void ShardTables::Capture(ShardSnapshot* snapshot) const {
  for (const std::unique_ptr<Table>& table : tables_) table->Capture(snapshot);
}

void ShardTables::AddStats(StatsResponse* response) const {
  for (const std::unique_ptr<Table>& table : tables_) table->AddStats(response);
}

void ShardTables::RefreshParameterBytes() {
  parameter_bytes_.store(dense_bytes_ + embeddings_->parameter_bytes(), std::memory_order_relaxed);
}

void ShardTables::RecordChanges(bool record) {
  dense_->RecordSteps(record);
  embeddings_->ForgetChanges(/*forward=*/record);
}

absl::Status ShardTables::ExportChanges(ReplicaUpdate* update) {
  ShardCheckpoint* checkpoint = update->mutable_state();
  // An update's gradients: a third of the bytes of the values and the
  // optimizer state they leave with Adam, half with Adagrad.
  if (!dense_->TakeSteps(update->mutable_dense_steps())) {
    update->clear_dense_steps();
    dense_->Export(checkpoint);
  }
  return embeddings_->ExportChanges(checkpoint);
}

absl::Status ShardTables::ApplyChanges(const ReplicaUpdate& update,
                                       absl::FunctionRef<void()> checked) {
  const ShardCheckpoint& delta = update.state();
  if (delta.shard() != shard_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update is of shard ", delta.shard(), ", this is shard ", shard_));
  }
  // Everything is checked before anything changes: the dense table's
  // Restore checks all before it replaces its variables.
  PST_RETURN_IF_ERROR(embeddings_->CheckChanges(delta));
  const bool as_steps = update.has_dense_steps();
  if (as_steps) {
    if (!delta.variables().empty()) {
      return absl::InvalidArgumentError(
          "an update carries its dense variables both whole and as steps");
    }
    PST_RETURN_IF_ERROR(dense_->CheckSteps(update.dense_steps()));
  } else {
    // Every dense variable travels whole (DenseTable::Export): another set
    // would replace the backup's variables with it.
    const VariableStore& store = dense_->store();
    if (delta.variables_size() != static_cast<int>(store.size()) ||
        std::any_of(delta.variables().begin(), delta.variables().end(),
                    [&](const ShardCheckpoint::Variable& v) { return store.Find(v.name()) < 0; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("the update carries ", delta.variables_size(),
                       " dense variable(s) whole that are not the shard's ", store.size()));
    }
    PST_RETURN_IF_ERROR(dense_->Restore(delta));
  }
  dense_->RecordSteps(false);  // a backup's own updates are its primary's
  checked();
  // The steps are applied after the answer, as the rows are written.
  if (as_steps) {
    if (absl::Status s = dense_->ApplySteps(update.dense_steps()); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("the update's dense steps do not apply here as on the primary (",
                       s.message(), "): these variables are not the primary's"));
    }
  }
  PST_RETURN_IF_ERROR(embeddings_->ApplyChanges(delta));
  dense_bytes_ = dense_->parameter_bytes();
  RefreshParameterBytes();
  return absl::OkStatus();
}

}  // namespace pst
