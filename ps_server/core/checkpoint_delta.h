// A delta checkpoint applied to the one it was taken over.
//
// A delta (ShardCheckpoint.delta) holds a shard's state whole but for its
// embedding tables' rows: of each table it holds the header (spec, seed,
// counters), the rows changed since its parent and the ids removed since.
// Applying it to its parent's state gives the state a full checkpoint at
// the delta's version would hold: the same rows, state, update counts and
// counters (RAM's rows and the disk tier's are not told apart in a
// checkpoint, so the rows' order may differ).
#ifndef PST_PS_SERVER_CORE_CHECKPOINT_DELTA_H_
#define PST_PS_SERVER_CORE_CHECKPOINT_DELTA_H_

#include "absl/status/statusor.h"
#include "ps.pb.h"

namespace pst {

// The state at delta.version(): `delta`'s own fields and table headers,
// and each table's rows: `parent`'s (the whole state at
// delta.parent_version(): a full checkpoint, or one a chain gave), less
// the delta's removed ids, with the delta's rows replacing theirs or
// added after them. The result is no delta. DataLoss, saying what, when
// the two do not fit together: `parent` is not at the version the delta
// names, another shard's, or holds other tables; sizes that disagree
// with a table's dim; an id twice in `parent`.
absl::StatusOr<ShardCheckpoint> ApplyDelta(ShardCheckpoint parent, ShardCheckpoint delta);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_CHECKPOINT_DELTA_H_
