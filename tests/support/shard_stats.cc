#include "tests/support/shard_stats.h"

#include <chrono>

#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "ps.grpc.pb.h"

namespace pst {

int64_t VersionAt(const std::string& address) {
  auto stub =
      ParameterServer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  StatsResponse stats;
  if (!stub->Stats(&context, StatsRequest(), &stats).ok()) return -1;
  return stats.version();
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
