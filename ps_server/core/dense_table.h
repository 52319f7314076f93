// The shard's dense variables as a Table (ps_server/core/table.h): named tensors
// of fixed shapes with their optimizer state (VariableStore), and the SYNC
// step's rank-ordered sum of them (StepAggregate), reduced and applied on
// a few threads of the table's own (ps_server/core/sync_reduce.h).
//
// Beyond the Table contract, the dense table gives the shard's dense-only
// paths what they need: the variables a pull encodes straight from their
// buffers, and the staging of an ASYNC push applied while it streams in
// (ps_server/core/streamed_update.h).
#ifndef PST_PS_SERVER_CORE_DENSE_TABLE_H_
#define PST_PS_SERVER_CORE_DENSE_TABLE_H_

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "ps_server/optimizers/optimizer.h"
#include "ps_server/core/step_aggregate.h"
#include "ps_server/core/table.h"
#include "ps_server/core/variable_store.h"

namespace pst {

class DenseTable final : public Table {
 public:
  DenseTable(std::unique_ptr<Optimizer> optimizer, int num_workers);

  bool initialized() const override { return store_.initialized(); }
  int64_t parameter_bytes() const override { return store_.parameter_bytes(); }
  absl::Status Initialize(const InitRequest& request) override;
  absl::Status CheckPush(const PushRequest& push, bool require_all, bool check_finite,
                         TablePush* plan) const override;
  absl::Status Stage(const PushRequest& push, const TablePush& plan,
                     const UpdateSettings& settings) override;
  double SquaredNorm(const PushRequest& push, const TablePush& plan) const override;
  void Land(int rank, const PushRequest& push, const TablePush& plan) override;
  absl::Status StageStep(const UpdateSettings& settings) override;
  double StepSquaredNorm() override { return step_.SquaredNormOfMean(); }
  void Commit() override { store_.Commit(); }
  void Discard() override { store_.Discard(); }
  void Export(ShardCheckpoint* checkpoint) const override { store_.Export(checkpoint); }
  absl::Status Restore(const ShardCheckpoint& checkpoint) override;
  void AddStats(StatsResponse* response) const override;

  // Replicas (VariableStore::RecordSteps, TakeSteps): a primary keeps
  // each update's optimizer steps for its backups. A backup checks them
  // (CheckSteps: InvalidArgument for steps that do not fit the variables,
  // VariableStore::CheckReplayed), then applies them all or nothing (a
  // large variable split over the table's threads) and commits, bitwise
  // as the primary did. ApplySteps, for steps CheckSteps passed, fails
  // (InvalidArgument, no change) only where a result is not finite, which
  // the same step on the primary's variables never gives.
  void RecordSteps(bool record) { store_.RecordSteps(record); }
  bool TakeSteps(DenseSteps* steps) { return store_.TakeSteps(steps); }
  absl::Status CheckSteps(const DenseSteps& steps) const;
  absl::Status ApplySteps(const DenseSteps& steps);

  // The variables a pull names, each once, in its order (every variable,
  // in the store's order, if it names none; none for a pull of rows only).
  // InvalidArgument for an unknown or repeated name; `shard` names the shard.
  absl::StatusOr<std::vector<const Variable*>> Select(const PullRequest& pull, int shard) const;
  // For a push that streams in, given its header: the indices of the
  // variables it names, in its order, and the payload bytes each gradient
  // must carry, from the table's own shapes (so that a header cannot make
  // the receiver allocate more than the model). InvalidArgument for an
  // unknown or repeated variable, a wrong shape, an unknown dtype, or, with
  // `require_all`, a variable it leaves out.
  absl::Status CheckStreamHeader(const PushRequest& header, bool require_all,
                                 std::vector<int>* indices, std::vector<int64_t>* bytes) const;

  // The variables, for pulls (read under the shard's lock) and for a
  // streamed update's staging (VariableStore::BeginStage, FinishStage).
  const VariableStore& store() const { return store_; }
  VariableStore& store() { return store_; }
  // Where a large variable's update is split, in up to parts() shares.
  ThreadPool& threads() { return threads_; }
  int parts() const { return parts_; }

 private:
  // Empties the step and sizes it to the variables.
  void ResetStep();

  VariableStore store_;
  StepAggregate step_;
  ThreadPool threads_;
  const int parts_ = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_DENSE_TABLE_H_
