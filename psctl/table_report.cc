#include "psctl/table_report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pst {

std::string EmbeddingTableReport(const std::vector<StatsResponse>& shards) {
  std::string report;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (const EmbeddingTableStats& table : shards[s].embeddings()) {
      if (report.empty()) {
        report = absl::StrFormat("%-20s %-6s %5s %12s %14s %13s %12s %12s\n", "table", "shard",
                                 "dim", "rows", "bytes", "rows_admitted", "rows_refused",
                                 "rows_evicted");
      }
      absl::StrAppendFormat(&report, "%-20s %-6s %5d %12d %14d %13d %12d %12d\n", table.table(),
                            absl::StrCat("ps:", s), table.dim(), table.rows(), table.bytes(),
                            table.rows_admitted(), table.rows_refused(), table.rows_evicted());
    }
  }
  return report;
}

std::string TableTierReport(const std::vector<StatsResponse>& shards) {
  std::string report;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (const EmbeddingTableStats& t : shards[s].embeddings()) {
      if (t.rows_on_disk() == 0 && t.disk_bytes() == 0 && t.disk_reads() == 0 &&
          t.rows_demoted() == 0 && t.rows_expired() == 0) {
        continue;  // all in RAM, nothing expired
      }
      if (report.empty()) {
        report =
            absl::StrFormat("%-20s %-6s %14s %12s %14s %8s %12s %12s %12s %12s\n", "table", "shard",
                            "rows_in_memory", "rows_on_disk", "disk_bytes", "hit_rate",
                            "disk_waits", "rows_demoted", "rows_promoted", "rows_expired");
      }
      const int64_t reads = t.lookups_in_memory() + t.disk_reads();
      const std::string hit_rate =
          reads == 0 ? "-"
                     : absl::StrFormat("%.1f%%", 100.0 * double(t.lookups_in_memory()) / reads);
      absl::StrAppendFormat(&report, "%-20s %-6s %14d %12d %14d %8s %12d %12d %12d %12d\n",
                            t.table(), absl::StrCat("ps:", s), t.rows_in_memory(), t.rows_on_disk(),
                            t.disk_bytes(), hit_rate, t.disk_waits(), t.rows_demoted(),
                            t.rows_promoted(), t.rows_expired());
    }
  }
  return report;
}

std::string RefusalReport(const std::vector<StatsResponse>& shards) {
  std::string report = absl::StrFormat("%-6s %9s %9s %11s %16s\n", "shard", "exchanges",
                                       "sessions", "connections", "region_handoffs");
  for (size_t s = 0; s < shards.size(); ++s) {
    const StatsResponse& shard = shards[s];
    absl::StrAppendFormat(&report, "%-6s %9d %9d %11d %16d\n", absl::StrCat("ps:", s),
                          shard.exchanges_refused(), shard.sessions_refused(),
                          shard.connections_refused(), shard.region_handoffs_refused());
  }
  return report;
}

std::string ReplicationReport(const std::vector<StatsResponse>& shards) {
  std::string report;
  for (size_t s = 0; s < shards.size(); ++s) {
    if (!shards[s].has_replication()) continue;
    const ReplicationStats& r = shards[s].replication();
    if (report.empty()) {
      report = absl::StrFormat("%-6s %7s %8s %11s %7s %5s %6s %9s %8s %12s %9s\n", "shard",
                               "primary", "epoch", "replicated", "backup", "live", "chain", "acked",
                               "lag", "lag_bytes", "failovers");
    }
    for (const ReplicationStats::Backup& b : r.backups()) {
      absl::StrAppendFormat(&report, "%-6s %7d %8d %11d %7d %5s %6s %9d %8d %12d %9d\n",
                            absl::StrCat("ps:", s), r.replica(), r.epoch(), r.replicated_version(),
                            b.replica(), b.live() ? "yes" : "NO", b.in_chain() ? "yes" : "no",
                            b.acked_version(), b.lag_versions(), b.lag_bytes(), r.became_primary());
    }
  }
  return report;
}

}  // namespace pst
