#include "psctl/table_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pst {

std::string EmbeddingTableReport(const std::vector<StatsResponse>& shards) {
  std::string report;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (const EmbeddingTableStats& table : shards[s].embeddings()) {
      if (report.empty()) {
        report = absl::StrFormat("%-20s %-6s %5s %12s %14s %13s %12s\n", "table", "shard", "dim",
                                 "rows", "bytes", "rows_admitted", "rows_refused");
      }
      absl::StrAppendFormat(&report, "%-20s %-6s %5d %12d %14d %13d %12d\n", table.table(),
                            absl::StrCat("ps:", s), table.dim(), table.rows(), table.bytes(),
                            table.rows_admitted(), table.rows_refused());
    }
  }
  return report;
}

}  // namespace pst
