// psctl status's sections read from the shards' Stats: each embedding
// table's share on each shard (rows held, the memory they take, rows
// created, and new rows refused at the row limit), and what each shard
// refused of its callers.
#ifndef PST_PSCTL_TABLE_REPORT_H_
#define PST_PSCTL_TABLE_REPORT_H_

#include <string>
#include <vector>

#include "ps.pb.h"

namespace pst {

// The section's lines, a header line first, one line per table and shard
// (shards in order, tables as each shard lists them); "" when no shard
// holds a table.
std::string EmbeddingTableReport(const std::vector<StatsResponse>& shards);

// The tiers' lines, a header line first, one line per table and shard that
// has a disk tier or expires rows (TableStorage): rows in RAM and on disk,
// the disk tier's bytes, the share of row reads RAM answered, rows
// demoted, promoted and expired; "" when no table has either.
std::string TableTierReport(const std::vector<StatsResponse>& shards);

// The replicas' lines, a header line first, one line per backup of each
// shard as its primary sees it: the shard's epoch and the version every
// live backup holds, then the backup's place, whether it counts (live),
// the version it acknowledged and how far, in versions and bytes, it
// lags; and the failovers to the primary. "" when no shard has backups.
std::string ReplicationReport(const std::vector<StatsResponse>& shards);

// The refusals' lines, a header line first, one line per shard: exchanges
// refused for load, calls refused for a worker another process holds, TCP
// connections reset at the per-source cap, and shared-memory region
// handoffs refused.
std::string RefusalReport(const std::vector<StatsResponse>& shards);

}  // namespace pst

#endif  // PST_PSCTL_TABLE_REPORT_H_
