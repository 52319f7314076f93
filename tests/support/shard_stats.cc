#include "tests/support/shard_stats.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "ps.grpc.pb.h"
#include "tests/support/eventually.h"

namespace pst {

namespace {

bool StatsAt(const std::string& address, StatsResponse* stats) {
  auto stub =
      ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return stub->Stats(&context, StatsRequest(), stats).ok();
}

}  // namespace

int64_t VersionAt(const std::string& address) {
  StatsResponse stats;
  return StatsAt(address, &stats) ? stats.version() : -1;
}

bool AwaitBackupsInChain(const std::string& address, absl::Duration timeout) {
  return Eventually(
      [&] {
        StatsResponse stats;
        return StatsAt(address, &stats) && stats.replication().backups_size() > 0 &&
               std::all_of(stats.replication().backups().begin(),
                           stats.replication().backups().end(),
                           [](const ReplicationStats::Backup& b) { return b.in_chain(); });
      },
      timeout, absl::Milliseconds(20));
}

int64_t AwaitVersion(const std::string& address, int64_t version, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int64_t reached = -1;
  while ((reached = VersionAt(address)) < version && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  return reached;
}

}  // namespace pst
