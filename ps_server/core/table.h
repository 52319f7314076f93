// One kind of state a parameter-server shard holds, behind the contract the
// shard (ps_server/core/parameter_shard.h) coordinates: its storage, how a push's
// part is checked, staged alone or summed into a SYNC step, the all-or-
// nothing commit, and its share of checkpoints and Stats. The dense
// variables (ps_server/core/dense_table.h) are the first kind; a kind addressed
// by row ids plugs in as another Table, not as another shard.
//
// Thread-safety: the shard serializes every call under its lock, except
// Land, which runs outside it (see there).
#ifndef PST_PS_SERVER_CORE_TABLE_H_
#define PST_PS_SERVER_CORE_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "ps.pb.h"
#include "ps_server/core/shard_snapshot.h"
#include "ps_server/core/update_settings.h"

namespace pst {

// What a table found checking its part of one push, for Stage or Land.
struct TablePush {
  // The table's entries the push's parts update, in the push's order (for
  // the dense table: each gradient's variable).
  std::vector<int> indices;
};

class Table {
 public:
  virtual ~Table() = default;

  // Whether Initialize or Restore has given the table its contents.
  virtual bool initialized() const = 0;
  // Bytes of the table's values as float32.
  virtual int64_t parameter_bytes() const = 0;

  // Takes the table's initial contents from `request`. InvalidArgument, and
  // no change, for a malformed one. Precondition: nothing has been staged
  // since an earlier Initialize (the shard calls it again, with the next
  // Init, when a table after this one refused the first).
  virtual absl::Status Initialize(const InitRequest& request) = 0;

  // Checks the table's part of `push` (names, shapes, payload sizes, and
  // finiteness when `check_finite`; with `require_all`, that every entry is
  // present) and fills `plan`. InvalidArgument naming the first offending
  // part; nothing changes either way.
  virtual absl::Status CheckPush(const PushRequest& push, bool require_all, bool check_finite,
                                 TablePush* plan) const = 0;

  // An update is a set of staged changes made visible all at once by
  // Commit or dropped by Discard. A table may write its part in place at
  // Stage and undo it at Discard: between Stage (or StageStep) and Commit
  // or Discard the shard calls nothing else of the table (its lock spans
  // them). Stage adds `push`'s part (checked into
  // `plan`) with `settings` (update_settings.h); InvalidArgument, naming
  // the entry, if the result would not be finite.
  virtual absl::Status Stage(const PushRequest& push, const TablePush& plan,
                             const UpdateSettings& settings) = 0;
  // The squared 2-norm of `push`'s part (checked into `plan`): the
  // clipping's measure of an update applied on its own.
  virtual double SquaredNorm(const PushRequest& push, const TablePush& plan) const = 0;

  // The SYNC step: Land adds rank `rank`'s part to the step. It runs
  // outside the shard's lock, concurrently for different ranks; the shard
  // admits one push per rank per step and calls nothing else of the step
  // while one lands. StageStep stages the step's mean (the landed ranks'
  // parts summed in rank order, bitwise independent of arrival order, over
  // the ranks that landed) and empties the step; its error is Stage's.
  virtual void Land(int rank, const PushRequest& push, const TablePush& plan) = 0;
  virtual absl::Status StageStep(const UpdateSettings& settings) = 0;
  // The squared 2-norm of the step's mean so far (every admitted push has
  // landed), for the clipping; the step is unchanged.
  virtual double StepSquaredNorm() = 0;

  virtual void Commit() = 0;
  virtual void Discard() = 0;

  // The table's contents, optimizer state included, into or out of a
  // checkpoint. Restore: InvalidArgument, and no change, for a checkpoint
  // this table cannot hold; it empties the step.
  virtual void Export(ShardCheckpoint* checkpoint) const = 0;
  virtual absl::Status Restore(const ShardCheckpoint& checkpoint) = 0;
  // The table's part of a checkpoint taken under the shard's lock
  // (shard_snapshot.h): Export now, unless the table can hand a view over
  // and export from it later.
  virtual void Capture(ShardSnapshot* snapshot) { Export(&snapshot->checkpoint); }

  // Adds the table's figures to `response` (counts and bytes add up over
  // the shard's tables).
  virtual void AddStats(StatsResponse* response) const = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_TABLE_H_
