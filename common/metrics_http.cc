#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, metrics_port, 0,
          "Serve Prometheus metrics over HTTP at http://<metrics_address>:<port>/metrics "
          "(0 = off). Under pslaunch: the first PS gets this port, the other tasks the next "
          "ones in task order.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1",
          "Address the metrics endpoint binds (0.0.0.0 to let other hosts scrape it).");

namespace pst::metrics {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

struct Handler {
  static MHD_Result Answer(void* self, MHD_Connection* connection, const char* url,
                           const char* method, const char*, const char*, size_t*, void**) {
    const MetricsServer* server = static_cast<const MetricsServer*>(self);
    unsigned int code = MHD_HTTP_OK;
    std::string body;
    if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
      code = MHD_HTTP_METHOD_NOT_ALLOWED;
      body = "only GET is served\n";
    } else if (std::strcmp(url, "/metrics") != 0) {
      code = MHD_HTTP_NOT_FOUND;
      body = "not found: metrics are at /metrics\n";
    } else {
      body = server->exposition_->Render();
    }
    MHD_Response* response = MHD_create_response_from_buffer(
        body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
    if (response == nullptr) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE,
                            code == MHD_HTTP_OK ? kContentType : "text/plain");
    MHD_Result queued = MHD_queue_response(connection, code, response);
    MHD_destroy_response(response);
    return queued;
  }
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Exposition* exposition,
                                                                   const std::string& address,
                                                                   int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port ", port, " is not in 0..65535"));
  }
  sockaddr_storage storage{};
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    flags |= MHD_USE_IPv6;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", address, "\" is not an IP address; use e.g. 127.0.0.1 or 0.0.0.0"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer(exposition));
  server->daemon_ = MHD_start_daemon(flags, static_cast<uint16_t>(port), nullptr, nullptr,
                                     &Handler::Answer, server.get(),
                                     MHD_OPTION_SOCK_ADDR, &storage, MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ":", port,
                                               "; is the port in use? pick another --metrics_port"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    const std::string& task) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port == 0) return nullptr;
  const std::string address = absl::GetFlag(FLAGS_metrics_address);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&GlobalExposition(), address, port);
  if (!server.ok()) {
    return absl::Status(server.status().code(),
                        absl::StrCat("--metrics_port: ", server.status().message()));
  }
  spdlog::info("{} metrics on http://{}:{}/metrics", task,
               address.find(':') == std::string::npos ? address : "[" + address + "]",
               (*server)->port());
  return server;
}

namespace {

bool IsLoopbackIp(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, address.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace

std::optional<std::string> ExposureWarning(const std::string& address, int port,
                                           bool cluster_tls) {
  if (port == 0 || !cluster_tls || IsLoopbackIp(address)) return std::nullopt;
  return absl::StrCat(
      "the metrics endpoint on ", address, ":", port,
      " (--metrics_address) is plain HTTP without the cluster's TLS or token: anyone who can "
      "reach it reads the job's metrics; bind it to 127.0.0.1 or to a network only your "
      "scraper reaches");
}

std::optional<std::string> ExposureWarningFromFlags(bool cluster_tls) {
  return ExposureWarning(absl::GetFlag(FLAGS_metrics_address), absl::GetFlag(FLAGS_metrics_port),
                         cluster_tls);
}

}  // namespace pst::metrics
