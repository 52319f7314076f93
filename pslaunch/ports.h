// The ports a run's tasks will bind, checked before pslaunch starts any of
// them: a port that is taken or out of range is one line and exit code 2
// up front, not a task failing after its peers have started.
#ifndef PST_PSLAUNCH_PORTS_H_
#define PST_PSLAUNCH_PORTS_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "config.pb.h"

namespace pst {

// "host:port" or "[v6]:port" split into the host (without brackets) and the
// port; nullopt if there is no numeric port.
std::optional<std::pair<std::string, int>> SplitHostPort(const std::string& address);

// What the tasks' metrics endpoints bind: `first_port` for the first task
// (0: none), the next ports for the others, on `address`.
struct MetricsPorts {
  int first_port = 0;
  std::string address;
};

// InvalidArgument naming the flag or config field, and what to change, when
// - a metrics port would be past 65535 or `metrics.address` is no IP address;
// - a metrics port is a port that some cluster.ps address names;
// - a cluster.ps address with a port other than 0, or a metrics port,
//   cannot be bound on this host because another socket listens there
//   (EADDRINUSE) or this user may not bind it (EACCES).
// The check binds and closes a socket per address, with SO_REUSEADDR as
// ps_server and the metrics endpoint do; a cluster.ps name that does not
// resolve, or an address not on this host, is left for its PS to report.
absl::Status CheckTaskPorts(const JobConfig& config, const MetricsPorts& metrics);

}  // namespace pst

#endif  // PST_PSLAUNCH_PORTS_H_
