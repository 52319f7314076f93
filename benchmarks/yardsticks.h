// What ps_bench (benchmarks/ps_bench.cc) sets its rows beside: a warm
// memcpy, loopback TCP measured by iperf3, and another system's rows read
// from --peer_json.
#ifndef PST_BENCHMARKS_YARDSTICKS_H_
#define PST_BENCHMARKS_YARDSTICKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pst {

// A warm memcpy of `bytes` (source and destination touched first), in GB/s:
// the ceiling of any one-way move of a tensor on this host.
double MemcpyGbps(int64_t bytes);

// Loopback TCP with 1 MiB writes, by iperf3; nullopt when not installed.
std::optional<double> IperfGbps();

// A row of --peer_json.
struct PeerRow {
  int64_t size_bytes = 0;
  int workers = 0;
  double gbps = 0;
  std::optional<double> cpu_us_per_round_trip, p50_us;
};

// The rows of a --peer_json file, one JSON object a line; InvalidArgument
// naming the file and line of the first that is not a row.
absl::StatusOr<std::vector<PeerRow>> ReadPeerRows(const std::string& path);
// The peer's row for `size` bytes and `workers` workers, if it has one.
std::optional<PeerRow> FindPeer(const std::vector<PeerRow>& peers, int64_t size, int workers);
// ours / theirs with three decimals, or "null" when either is missing.
std::string Ratio(std::optional<double> ours, std::optional<double> theirs);

}  // namespace pst

#endif  // PST_BENCHMARKS_YARDSTICKS_H_
