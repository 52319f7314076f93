// Registering with every shard, and following a replicated shard's
// primary there: Register asks the replica last found, then the others
// (ShardChannel, "Replicas").
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/channel.h"
#include "spdlog/spdlog.h"
#include "worker/client/ps_client.h"
#include "worker/client/shard_channel.h"

namespace pst {

absl::Status ShardChannel::RegisterAt(int s, int place, absl::Duration deadline,
                                      RegisterResponse* response) {
  grpc::ClientContext context;
  PrepareContext(&context, deadline);
  RegisterRequest request;
  request.set_worker(worker_);
  grpc::Status rpc;
  {
    Endpoint* endpoint;
    {
      absl::MutexLock lock(&endpoint_mu_);
      endpoint = shards_[s].endpoints[place].get();
    }
    rpc = endpoint->stub->Register(&context, request, response);
  }
  return rpc.ok() ? absl::OkStatus() : ShardError(s, rpc);
}

absl::Status ShardChannel::RegisterFollowing(int s, RegisterResponse* response) {
  Shard& shard = shards_[s];
  const int replicas = static_cast<int>(shard.endpoints.size());
  if (replicas == 1) return RegisterAt(s, 0, kRpcDeadline, response);
  // A replicated shard's answer is quick or its replica is away: a short
  // wait (Shard::register_wait), so that a worker finds a new primary within
  // a fraction of a second. (A killed replica's restart binds its port a
  // second or two before it serves: a connection there is taken and left
  // unanswered.) A wait that runs out counts as the replica away
  // (UNAVAILABLE, which the session waits out), not as the shard failing:
  // on a busy host a live primary may answer after it.
  auto ask = [&](int place) {
    absl::Status status = RegisterAt(s, place, shard.register_wait, response);
    if (absl::IsDeadlineExceeded(status)) {
      shard.register_wait = std::min(2 * shard.register_wait, kRpcDeadline);
      absl::Status away(absl::StatusCode::kUnavailable,
                        absl::StrCat(status.message(), " (replica ", place, " did not answer)"));
      status.ForEachPayload(
          [&](absl::string_view type, const absl::Cord& value) { away.SetPayload(type, value); });
      return away;
    }
    if (status.ok()) shard.register_wait = kShortestRegisterWait;
    return status;
  };
  int at;
  {
    absl::MutexLock lock(&endpoint_mu_);
    at = shard.at;
  }
  absl::Status status = ask(at);
  if (status.ok()) {
    if (shard.epoch >= 0 && response->epoch() != shard.epoch) {
      shard.version_after_failover = response->version();
      spdlog::info("ps:{}: {} (replica {}) is its primary again, at epoch {}", s,
                   shard.endpoints[at]->address, at, response->epoch());
    }
    shard.epoch = response->epoch();
    return status;
  }
  if (!IsTransientShardError(status)) return status;
  for (int k = 1; k < replicas; ++k) {
    const int place = (at + k) % replicas;
    // A replica that was away (killed, restarted) may have come back as
    // the new primary: its channel connects now, not when gRPC's reconnect
    // backoff (up to a second) would have it try again.
    grpc::experimental::ChannelResetConnectionBackoff(shard.endpoints[place]->channel.get());
    if (!ask(place).ok()) continue;
    {
      absl::MutexLock lock(&endpoint_mu_);
      shard.at = place;
    }
    shard.version_after_failover = response->version();
    shard.epoch = response->epoch();
    // Another process: it knows nothing of this worker's region.
    shard.region_attached = false;
    shard.region_handle = 0;
    spdlog::info("ps:{}: its primary is now {} (replica {}, epoch {})", s,
                 shard.endpoints[place]->address, place, response->epoch());
    return absl::OkStatus();
  }
  return status;
}

absl::StatusOr<RegisterResponse> ShardChannel::Register() {
  std::vector<RegisterResponse> responses(shards_.size());
  PST_RETURN_IF_ERROR(ForEachShard([&](int s) { return RegisterFollowing(s, &responses[s]); }));
  for (size_t s = 0; s < shards_.size(); ++s) {
    // The shard's count, the first time: a worker that restarted resumes
    // it. After that this worker's own, which a failover does not move.
    if (shards_[s].pushes < 0) shards_[s].pushes = responses[s].worker_clock();
    if (responses[s].max_request_bytes() > 0) {
      shards_[s].max_request_bytes = responses[s].max_request_bytes();
    }
    if (responses[s].max_reply_bytes() > 0) {
      shards_[s].max_reply_bytes = responses[s].max_reply_bytes();
    }
    if (responses[s].max_rows_per_pull() > 0) {
      shards_[s].max_rows_per_pull = responses[s].max_rows_per_pull();
    }
  }
  return responses[0];
}

}  // namespace pst
