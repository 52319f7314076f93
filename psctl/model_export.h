// The trained model out of a job's checkpoints, as arrays a user loads
// without pstrain (psctl export).
//
// Each shard's newest valid checkpoint gives its share: of the newest each
// of its replicas wrote (replica 0 in <dir>/shard-<i>/, a backup k in
// <dir>/replica-<k>/shard-<i>/; each read as a PS restore reads it:
// ReadNewestValidCheckpoint, a delta with its chain applied), the latest
// version of the run. A replica that was away, or still catching up, when
// the run ended holds an older one than the replica that ended it as
// primary. Together they give
//  - every dense variable whole, float32 of the variable's shape: the
//    slices placement cut over the shards ("<name>/part-<p>") joined back
//    in row order under "<name>";
//  - every embedding table (each part of a table of parts, as the table
//    it stands for: EmbeddingTableConfig.parts) as "<table>.ids" (int64
//    [n], sorted) and
//    "<table>.rows" (float32 [n, dim], row i of id ids[i]): the rows the
//    shards hold, those trained (a row never trained, or evicted, is not
//    among them: a pull answers its initial value);
//  - and, where the id space is small, "<table>" (float32 [max_id + 1,
//    dim]): row i of id i, an id the shards do not hold filled with its
//    initial value (ps_server/core/embedding_init.h), as a pull answers it.
//    Small: every id in [0, 2^24) and max_id + 1 <= 4 n, so the dense form
//    takes at most 4 times the bytes of the rows.
// The optimizer's state (slots) is not exported.
#ifndef PST_PSCTL_MODEL_EXPORT_H_
#define PST_PSCTL_MODEL_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/npz.h"
#include "ps.pb.h"

namespace pst {

// The largest id space a table is exported in dense form for, and how many
// times its rows' bytes the dense form may take.
inline constexpr int64_t kDenseTableMaxIds = int64_t{1} << 24;
inline constexpr int64_t kDenseTableMaxRatio = 4;

// Every shard's newest valid checkpoint in `dir` (across its replicas'
// folders, of shard 0's run), shard i at [i]. InvalidArgument, naming the
// folder and what to do, when `dir` holds no shard-<i> folder, a shard in
// 0 .. the highest found (or the shard count a table was placed for) has
// no valid checkpoint, or none of shard 0's run.
absl::StatusOr<std::vector<ShardCheckpoint>> ReadShardCheckpoints(const std::string& dir);

// The model the shards' checkpoints hold, as the arrays above.
// InvalidArgument when the slices of a variable do not join (a part
// missing, shapes that disagree) or two arrays would share a name.
absl::StatusOr<std::vector<NpzArray>> ModelArrays(const std::vector<ShardCheckpoint>& shards);

// One table's arrays from its rows in any order: ids[i]'s row at
// values[i * dim].
std::vector<NpzArray> TableArrays(const std::string& table, int dim, uint64_t seed, float scale,
                                  std::vector<uint64_t> ids, const std::vector<float>& values);

}  // namespace pst

#endif  // PST_PSCTL_MODEL_EXPORT_H_
