// The control calls to the shards: heartbeats, Done (to a replicated
// shard's primary, then its backups), Stats of a shard's primary, the wait
// for every worker's Done, and the admin calls psctl makes (checkpoint,
// shutdown).
#include <optional>

#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "worker/client/shard_channel.h"

namespace pst {

absl::Status ShardChannel::Heartbeat() {
  return ForEachShard([&](int s) { return Heartbeat(s); });
}

absl::Status ShardChannel::Heartbeat(int s) {
  HeartbeatRequest request;
  request.set_worker(worker_);
  HeartbeatResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, kRpcDeadline);
  grpc::Status rpc = endpoint(s).stub->Heartbeat(&context, request, &response);
  return rpc.ok() ? absl::OkStatus() : ShardError(s, rpc);
}

absl::StatusOr<DoneResponse> ShardChannel::DoneAt(int shard, int place,
                                                  std::optional<int64_t> primary_version,
                                                  absl::Duration deadline) const {
  DoneRequest request;
  request.set_worker(worker_);
  if (primary_version) request.set_primary_version(*primary_version);
  DoneResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, deadline);
  grpc::Status rpc = shards_[shard].endpoints[place]->stub->Done(&context, request, &response);
  if (!rpc.ok()) return ShardError(shard, rpc);
  return response;
}

absl::Status ShardChannel::Done() {
  return ForEachShard([&](int s) {
    int at;
    {
      absl::MutexLock lock(&endpoint_mu_);
      at = shards_[s].at;
    }
    std::optional<int64_t> primary_version;
    const absl::Status status = Patiently([&]() -> absl::Status {
      absl::StatusOr<DoneResponse> response = DoneAt(s, at, std::nullopt, kRpcDeadline);
      if (response.ok() && response->primary()) primary_version = response->version();
      return response.status();
    });
    // The backups are told too, after the primary, with the primary's
    // version then: one that takes over then does not wait for this
    // worker, even where no update of the primary's follows this Done to
    // say so, or an older one arrives after it. One replica that took it
    // suffices (the primary may have died just now).
    bool taken = status.ok();
    for (int place = 0; place < static_cast<int>(shards_[s].endpoints.size()); ++place) {
      if (place != at && DoneAt(s, place, primary_version, kReplicaStatsDeadline).ok()) {
        taken = true;
      }
    }
    return taken ? absl::OkStatus() : status;
  });
}

absl::StatusOr<StatsResponse> ShardChannel::StatsAt(int shard, int place,
                                                    absl::Duration deadline) const {
  StatsResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, deadline);
  grpc::Status rpc =
      shards_[shard].endpoints[place]->stub->Stats(&context, StatsRequest(), &response);
  if (!rpc.ok()) return ShardError(shard, rpc);
  return response;
}

absl::StatusOr<ShardChannel::PrimaryStats> ShardChannel::StatsOfPrimary(int shard) const {
  const Shard& at_shard = shards_[shard];
  int first;
  {
    absl::MutexLock lock(&endpoint_mu_);
    first = at_shard.at;
  }
  absl::StatusOr<StatsResponse> stats = StatsAt(shard, first, kRpcDeadline);
  if (at_shard.endpoints.size() == 1 || (stats.ok() && stats->replication().primary())) {
    if (!stats.ok()) return stats.status();
    return PrimaryStats{.place = first, .stats = *std::move(stats)};
  }
  // The replica last found is not the primary (any more): ask them all. A
  // primary cut off from etcd may still say it is one, at an older epoch.
  std::optional<PrimaryStats> best;
  absl::Status failure = stats.status();
  const auto better = [](const StatsResponse& a, const StatsResponse& b) {
    return std::make_pair(a.replication().primary(), a.replication().epoch()) >
           std::make_pair(b.replication().primary(), b.replication().epoch());
  };
  if (stats.ok()) best = PrimaryStats{.place = first, .stats = *std::move(stats)};
  for (int place = 0; place < static_cast<int>(at_shard.endpoints.size()); ++place) {
    if (place == first) continue;
    absl::StatusOr<StatsResponse> answer = StatsAt(shard, place, kReplicaStatsDeadline);
    if (!answer.ok()) {
      if (failure.ok()) failure = answer.status();
      continue;
    }
    if (!best || better(*answer, best->stats)) {
      best = PrimaryStats{.place = place, .stats = *std::move(answer)};
    }
  }
  if (!best) return failure;
  return *std::move(best);
}

absl::StatusOr<StatsResponse> ShardChannel::Stats(int shard, std::string* answered_by) {
  PST_ASSIGN_OR_RETURN(PrimaryStats primary, StatsOfPrimary(shard));
  if (answered_by != nullptr) *answered_by = shards_[shard].endpoints[primary.place]->address;
  return std::move(primary.stats);
}

absl::StatusOr<StatsResponse> ShardChannel::AwaitWorkersDone(int shard, int64_t known_changes,
                                                             absl::Duration timeout) {
  AwaitWorkersDoneRequest request;
  request.set_known_changes(known_changes);
  request.set_worker(worker_);  // waits in this worker's own slots
  // Rounded up: a wait cut short of `timeout` would only be asked again.
  const int64_t timeout_ms = absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1)));
  request.set_timeout_ms(static_cast<int32_t>(
      std::clamp<int64_t>(timeout_ms, 0, std::numeric_limits<int32_t>::max())));
  StatsResponse response;
  PST_RETURN_IF_ERROR(Patiently([&] {
    grpc::ClientContext context;
    PrepareContext(&context, timeout + kRpcDeadline);
    grpc::Status rpc = endpoint(shard).stub->AwaitWorkersDone(&context, request, &response);
    return rpc.ok() ? absl::OkStatus() : ShardError(shard, rpc);
  }));
  return response;
}

absl::StatusOr<CheckpointResponse> ShardChannel::Checkpoint(int shard) {
  // At the primary: the checkpoint a restore of the shard reads first.
  PST_ASSIGN_OR_RETURN(PrimaryStats primary, StatsOfPrimary(shard));
  CheckpointResponse response;
  grpc::ClientContext context;
  PrepareContext(&context, kRpcDeadline);
  grpc::Status rpc = shards_[shard].endpoints[primary.place]->stub->Checkpoint(
      &context, CheckpointRequest(), &response);
  if (!rpc.ok()) return ShardError(shard, rpc);
  return response;
}

absl::Status ShardChannel::Shutdown(int shard) {
  // Every replica: a backup left running would take the office over.
  absl::Status first_failure;
  int stopped = 0;
  for (const std::unique_ptr<Endpoint>& endpoint : shards_[shard].endpoints) {
    ShutdownResponse response;
    grpc::ClientContext context;
    PrepareContext(&context, kRpcDeadline);
    grpc::Status rpc = endpoint->stub->Shutdown(&context, ShutdownRequest(), &response);
    if (rpc.ok()) {
      ++stopped;
    } else if (first_failure.ok()) {
      first_failure = ShardError(shard, rpc);
    }
  }
  return stopped > 0 ? absl::OkStatus() : first_failure;
}

}  // namespace pst
