#include "tests/cluster/membership/etcd_server.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/membership/etcd_client.h"
#include "cluster/membership/local_etcd.h"

namespace pst {

absl::StatusOr<std::unique_ptr<EtcdServer>> EtcdServer::Start() {
  static std::atomic<int> started{0};
  absl::Status status;
  // A port taken between FreeLoopbackPorts and etcd's bind makes etcd exit: new
  // ports, a few times.
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<std::vector<int>> ports = FreeLoopbackPorts(2);
    if (!ports.ok()) return ports.status();
    const std::string dir = absl::StrCat(ScratchDir(), "/etcd.", ++started);
    std::filesystem::create_directories(dir);
    std::unique_ptr<EtcdServer> server(
        new EtcdServer(dir, EtcdDataDir::Make(dir), (*ports)[0], (*ports)[1]));
    status = server->Launch();
    if (status.ok()) return server;
    if (!absl::IsInternal(status)) break;  // it runs but does not answer
  }
  return status;
}

EtcdServer::EtcdServer(std::string log_dir, EtcdDataDir data, int client_port, int peer_port)
    : log_dir_(std::move(log_dir)),
      data_(std::move(data)),
      client_port_(client_port),
      peer_port_(peer_port),
      endpoint_(absl::StrCat("127.0.0.1:", client_port)) {}

void EtcdServer::Kill() { process_.reset(); }

absl::Status EtcdServer::Restart() {
  Kill();
  return Launch();
}

absl::Status EtcdServer::Launch() {
  const std::string client_url = absl::StrCat("http://", endpoint_);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port_);
  const std::string log = absl::StrCat(log_dir_, ".log");
  process_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{kEtcdBinary, "--name=test",
                               absl::StrCat("--data-dir=", data_.path(), "/data"),
                               absl::StrCat("--listen-client-urls=", client_url),
                               absl::StrCat("--advertise-client-urls=", client_url),
                               absl::StrCat("--listen-peer-urls=", peer_url),
                               absl::StrCat("--initial-advertise-peer-urls=", peer_url),
                               absl::StrCat("--initial-cluster=test=", peer_url),
                               // etcd's minimum lease TTL is 1.5 election timeouts, rounded up
                               // to whole seconds: 1 s here, 2 s with the defaults.
                               "--heartbeat-interval=50", "--election-timeout=500"},
      log);
  ++launches_;
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect({endpoint_});
  if (!client.ok()) return client.status();
  // Ready once a read succeeds: etcd answers reads only with a leader.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::Status last;
  while (absl::Now() < deadline) {
    if (AwaitProcessEnd(process_->pid(), absl::ZeroDuration())) {
      return absl::InternalError(
          absl::StrCat("etcd exited at start ", launches_, "; see ", log, ":\n", ReadFile(log)));
    }
    // Each try bounded: EtcdClient retries an unreachable etcd until then.
    last = (*client)->Get("/ready", absl::Now() + absl::Milliseconds(200)).status();
    if (last.ok()) return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      absl::StrCat("etcd did not answer within 30 s (", last.ToString(), "); see ", log));
}

void EtcdTest::SetUp() {
  // The test command installs it (scripts/install_deps.sh), so a missing
  // etcd is a broken setup, not a machine without the means: fail loudly.
  if (access(kEtcdBinary, X_OK) != 0) {
    FAIL() << kEtcdBinary << " is not installed: run scripts/install_deps.sh (Debian's "
           << "etcd-server package)";
  }
  absl::StatusOr<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  etcd_ = *std::move(etcd);
}

}  // namespace pst
