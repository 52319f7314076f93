// A shard's state captured for a checkpoint under the shard's lock, and
// written out in full after the lock is released.
//
// A table either copies its part into `checkpoint` while captured, or
// hands over a view of its contents that the shard's later updates do not
// change (copy on write, as an embedding table's rows: row_store.h) and
// writes from it in Finish, outside the lock. So a table of millions of
// rows holds the shard's updates back for as long as taking its view
// takes, not for as long as copying its rows takes.
#ifndef PST_PS_SERVER_CORE_SHARD_SNAPSHOT_H_
#define PST_PS_SERVER_CORE_SHARD_SNAPSHOT_H_

#include <vector>

#include "absl/functional/any_invocable.h"
#include "ps.pb.h"

namespace pst {

// What a capture holds (the tables read it as they capture).
enum class CaptureKind {
  // Every row; what the tables track of their changes stays as it was.
  kWhole,
  // Every row, and a checkpoint chain starts here: the embedding tables
  // track their changes from now on.
  kChainStart,
  // Of each embedding table, only the rows changed and the ids removed
  // since the chain's previous capture (ShardCheckpoint.delta); tracked
  // anew from now on. Only when every table tracks its changes
  // (ShardTables::TracksChanges).
  kChainDelta,
};

struct ShardSnapshot {
  CaptureKind kind = CaptureKind::kWhole;
  // What was copied while captured.
  ShardCheckpoint checkpoint;
  // What is written in later, each from its own view.
  std::vector<absl::AnyInvocable<void(ShardCheckpoint*) &&>> later;

  // The whole checkpoint: `checkpoint` with every part of `later` written
  // in, in order. Needs no lock: the views belong to the snapshot.
  ShardCheckpoint Finish() &&;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SHARD_SNAPSHOT_H_
