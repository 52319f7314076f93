// Checks of a click-through-rate job's config (training.model.ctr with
// training.dataset.ctr), apart from the rest of the config's checks.
#ifndef PST_COMMON_CTR_CONFIG_H_
#define PST_COMMON_CTR_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config.pb.h"

namespace pst {

// The categorical fields and dense features each example of `data` has.
struct CtrShape {
  int fields = 0;
  int dense = 0;
};
CtrShape CtrShapeOf(const CtrDataConfig& data);

// InvalidArgument naming the field: a ctr model without ctr data (or ctr
// data without it), a table it names missing from training.model.
// embeddings, a wide table of dim other than 1, a hidden width below 1, no
// data file named, a generator for libsvm files or with bad options.
absl::Status ValidateCtrJob(const TrainingConfig& training);

// The tables a CTR job keeps on the shards. Its deep and wide tables are
// always fed the same ids, so where nothing but their names, dims,
// init_scales and storage.memory_bytes differ (the same optimizer, row
// limit, when_full and tiers; both budgeted or neither), the shards keep
// both as one table of parts (proto/config.proto,
// EmbeddingTableConfig.parts) named "<table>+<wide_table>", in the deep
// table's place: the deep columns, then the wide one, under the sum of
// their budgets (a disk tier under <disk>/<table>+<wide_table>-shard<i>).
// A pull, an update and a SYNC step then look each id up, and touch its
// record, once instead of twice; each part starts and trains as its table
// would apart (the optimizers are elementwise), and psctl export writes
// each part as its table. Other tables, and the two where they differ,
// are kept apart.
struct CtrTables {
  // training.model.embeddings resolved (common/embedding_config.h), in
  // order, the wide table dropped and the deep one replaced where `joint`.
  std::vector<EmbeddingTableConfig> tables;
  std::string deep;  // the table of the deep rows: the joint one where `joint`
  std::string wide;  // the wide table; empty without a wide part or where `joint`
  bool joint = false;
};
// InvalidArgument where the tables do not resolve.
absl::StatusOr<CtrTables> CtrShardTables(const TrainingConfig& training);

// The dense parameters of the CTR model's MLP (the tables' rows are not
// counted: they live on the PS and grow with the ids trained).
int64_t CtrDenseParameterCount(const TrainingConfig& training);

}  // namespace pst

#endif  // PST_COMMON_CTR_CONFIG_H_
