// The tables of one shard (ps_server/core/table.h) taken as one: a push is
// checked, staged, landed and committed in every table at once, and the
// shard's checkpoints and Stats cover them all. The embedding tables come
// first, since their Initialize and Restore check everything before
// changing anything, then the dense one; embeddings() and dense() are typed
// for the paths only one of them has (pulled rows; dense pulls, streamed
// pushes).
//
// Not thread-safe: the shard (ps_server/core/parameter_shard.h) calls it under
// its lock, except Land (see Table::Land) and parameter_bytes(), which any
// thread may read.
#ifndef PST_PS_SERVER_CORE_SHARD_TABLES_H_
#define PST_PS_SERVER_CORE_SHARD_TABLES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "ps.pb.h"
#include "ps_server/core/dense_table.h"
#include "ps_server/core/embedding_table.h"
#include "ps_server/core/model_share.h"
#include "ps_server/optimizers/optimizer.h"
#include "ps_server/core/shard_options.h"
#include "ps_server/core/table.h"

namespace pst {

class ShardTables {
 public:
  ShardTables(const ShardOptions& options, std::unique_ptr<Optimizer> optimizer);
  ShardTables(const ShardTables&) = delete;
  ShardTables& operator=(const ShardTables&) = delete;

  // Whether every table has its contents (Initialize or Restore).
  bool initialized() const;
  // Bytes of the tables' values as float32: set once they hold variables
  // and again at each Commit (embedding rows grow as they train).
  int64_t parameter_bytes() const { return parameter_bytes_.load(std::memory_order_relaxed); }

  // Each table's Initialize or Restore, in order; the first refusal is
  // returned. A table that took its contents before a later one refused
  // them takes the next Init's instead: the tables are not initialized
  // until every one is, and nothing is staged before. With a model in the
  // options, an Init carrying anything but this shard's share of it is
  // refused (ps_server/core/model_share.h); a checkpoint of another shard is.
  absl::Status Initialize(const InitRequest& request);
  absl::Status Restore(const ShardCheckpoint& checkpoint);

  // InvalidArgument unless every name `rates` gives a rate for is a
  // variable or table of this shard.
  absl::Status CheckRates(const UpdateRates& rates) const;
  // Each table's CheckPush into `plans` (one per table), checking values
  // for finiteness where `checked` does not vouch for them, and the push's
  // rates (CheckRates).
  absl::Status CheckPush(const PushRequest& push, bool require_all, PushChecked checked,
                         std::vector<TablePush>* plans) const;
  // Stages the push in every table with `settings`, its gradient first
  // clipped to a global norm of `clip_norm` over every table (0: not
  // clipped; update_settings.h ClipFactor); on a refusal, every table's
  // staging is discarded.
  absl::Status Stage(const PushRequest& push, const std::vector<TablePush>& plans,
                     UpdateSettings settings, float clip_norm);
  // The SYNC step (Table::Land, Table::StageStep), its mean clipped as
  // Stage clips a push: every table's step is emptied, also after a
  // failure; the first is returned.
  void Land(int rank, const PushRequest& push, const std::vector<TablePush>& plans);
  absl::Status StageStep(UpdateSettings settings, float clip_norm);
  void Commit();
  void Discard();

  void Export(ShardCheckpoint* checkpoint) const;
  // Replicas (EmbeddingTable::ExportChanges, ApplyChanges): what the
  // updates since the last ExportChanges changed, into `update`'s delta
  // state (the embedding rows changed and removed) and its dense steps
  // (DenseTable::TakeSteps; every dense variable whole in the state where
  // the steps do not tell the change), and a backup's side of it.
  // RecordChanges starts (or stops) keeping them and forgets what was kept.
  // ApplyChanges: InvalidArgument, and no change, for an update of another
  // shard or one that does not fit the tables; any other error (a disk
  // tier's failure, tables that were not the primary's) leaves the tables
  // part applied, and the backup needs the state whole. `checked` runs
  // once everything is checked, before any dense step is applied or row
  // written (a whole dense variable is in by then).
  void RecordChanges(bool record);
  absl::Status ExportChanges(ReplicaUpdate* update);
  absl::Status ApplyChanges(const ReplicaUpdate& update, absl::FunctionRef<void()> checked);
  // Each table's Capture (Table::Capture): what Finish writes outside the lock.
  void Capture(ShardSnapshot* snapshot) const;
  void AddStats(StatsResponse* response) const;

  // This shard's share of the options' model; nullopt when the workers
  // bring their own.
  const std::optional<ConfigModel>& model_share() const { return model_share_; }

  EmbeddingTable& embeddings() { return *embeddings_; }
  const EmbeddingTable& embeddings() const { return *embeddings_; }
  DenseTable& dense() { return *dense_; }
  const DenseTable& dense() const { return *dense_; }

 private:
  // Sets parameter_bytes_ from dense_bytes_ and the embedding rows held.
  void RefreshParameterBytes();

  const int shard_;
  // This shard's share of the options' model, when set.
  const std::optional<ConfigModel> model_share_;
  std::vector<std::unique_ptr<Table>> tables_;
  EmbeddingTable* const embeddings_;
  DenseTable* const dense_;
  std::atomic<int64_t> parameter_bytes_{0};
  // The dense table's share of it, fixed by Initialize or Restore (summing
  // a large model's variables at every commit would cost the shard's lock).
  int64_t dense_bytes_ = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SHARD_TABLES_H_
