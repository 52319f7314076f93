// psctl status's embedding-table section: each table's share on each
// shard (rows held, the memory they take, rows created, and new rows
// refused at the row limit), from the shards' Stats.
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

}  // namespace pst

#endif  // PST_PSCTL_TABLE_REPORT_H_
