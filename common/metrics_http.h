// Serves a metrics Exposition over HTTP for Prometheus: GET /metrics answers
// the text exposition format, any other path 404, any other method 405.
// Built on libmicrohttpd, with its own listening thread, so serving never
// touches the process's gRPC threads.
//
// ps_server and worker start one with --metrics_port (0 = none) on
// --metrics_address (127.0.0.1 by default: metrics stay on the host unless
// asked for).
#ifndef PST_COMMON_METRICS_HTTP_H_
#define PST_COMMON_METRICS_HTTP_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"

ABSL_DECLARE_FLAG(int, metrics_port);
ABSL_DECLARE_FLAG(std::string, metrics_address);

struct MHD_Daemon;

namespace pst::metrics {

class MetricsServer {
 public:
  // Listens on `address` (an IPv4 or IPv6 literal) and `port` (0 picks a
  // free one; see port()). InvalidArgument for an address that is not a
  // literal, Unavailable when the port cannot be bound. `exposition` must
  // outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const Exposition* exposition,
                                                             const std::string& address, int port);
  ~MetricsServer();  // stops listening and waits for requests in flight
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  explicit MetricsServer(const Exposition* exposition) : exposition_(exposition) {}

  const Exposition* exposition_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
  friend struct Handler;
};

// The server --metrics_port and --metrics_address ask for on
// GlobalExposition(), logged as "<task> metrics on http://ADDR:PORT/metrics";
// nullptr when --metrics_port is 0.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    const std::string& task);

// A warning when the metrics endpoint is on (--metrics_port) at an address
// other machines can reach in a cluster that secures its RPCs
// (`cluster_tls`): the endpoint is plain HTTP with no token, so it shows
// the job's figures to anyone who can reach it. nullopt otherwise.
std::optional<std::string> ExposureWarning(const std::string& address, int port,
                                           bool cluster_tls);
std::optional<std::string> ExposureWarningFromFlags(bool cluster_tls);

}  // namespace pst::metrics

#endif  // PST_COMMON_METRICS_HTTP_H_
