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

struct ShardSnapshot {
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
