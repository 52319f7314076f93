// PsClient: its calls handed to the transport (worker/client/shard_channel.h).
#include <utility>

#include "common/status_macros.h"
#include "worker/client/ps_client.h"
#include "worker/client/shard_channel.h"

namespace pst {

std::vector<std::vector<std::string>> ShardBackups(const ClusterConfig& cluster) {
  std::vector<std::vector<std::string>> backups(cluster.ps_size());
  for (int s = 0; s < cluster.ps_size() && s < cluster.ps_backups_size(); ++s) {
    backups[s].assign(cluster.ps_backups(s).address().begin(),
                      cluster.ps_backups(s).address().end());
  }
  return backups;
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    const std::vector<std::string>& addresses, int worker, absl::Duration connect_timeout,
    const ClusterSecurity& security, const std::vector<std::vector<std::string>>& backups) {
  PST_ASSIGN_OR_RETURN(
      std::unique_ptr<ShardChannel> channel,
      ShardChannel::Connect(addresses, worker, connect_timeout, security, backups));
  return std::unique_ptr<PsClient>(new PsClient(std::move(channel)));
}

PsClient::PsClient(std::unique_ptr<ShardChannel> channel) : channel_(std::move(channel)) {}
PsClient::~PsClient() = default;

void PsClient::set_wire_dtype(DType dtype) { channel_->set_wire_dtype(dtype); }
void PsClient::set_transport(Transport transport) { channel_->set_transport(transport); }
void PsClient::set_call_patience(absl::Duration patience) {
  channel_->set_call_patience(patience);
}
int PsClient::num_shards() const { return channel_->num_shards(); }
int PsClient::worker() const { return channel_->worker(); }
const std::string& PsClient::address(int shard) const { return channel_->address(shard); }
bool PsClient::uses_shared_memory(int shard) const {
  return channel_->uses_shared_memory(shard);
}

void PsClient::SetVariables(const std::vector<VariableSpec>& variables) {
  channel_->SetVariables(variables);
}
const std::vector<VariableSlice>& PsClient::slices() const { return channel_->slices(); }
void PsClient::SetEmbeddingTables(std::vector<EmbeddingTableConfig> tables) {
  channel_->SetEmbeddingTables(std::move(tables));
}
const std::vector<EmbeddingTableConfig>& PsClient::embedding_tables() const {
  return channel_->embedding_tables();
}
int PsClient::FindEmbeddingTable(absl::string_view name) const {
  return channel_->FindEmbeddingTable(name);
}

absl::StatusOr<PsClient::Tensors> PsClient::AllocateTensors() {
  return channel_->AllocateTensors();
}
absl::StatusOr<RegisterResponse> PsClient::Register() { return channel_->Register(); }
absl::StatusOr<bool> PsClient::Init(const std::vector<std::span<const float>>& values,
                                    std::span<const RowGradients> initial_rows) {
  return channel_->Init(values, initial_rows);
}

void PsClient::SetDenseOptimizer(std::optional<OptimizerConfig> optimizer) {
  channel_->SetDenseOptimizer(std::move(optimizer));
}

absl::Status PsClient::SetUpdateRates(const std::optional<UpdateRates>& rates) {
  return channel_->SetUpdateRates(rates);
}

absl::Status PsClient::Exchange(const ExchangeRequest& request, std::vector<int64_t>* versions,
                                std::vector<PushResponse>* responses) {
  const bool pushes = !request.computed_at.empty();
  const bool reads = !request.min_versions.empty();
  std::vector<int64_t> unused_versions;
  std::vector<PushResponse> unused_responses;
  if (versions == nullptr) versions = &unused_versions;
  if (responses == nullptr) responses = &unused_responses;
  if (pushes && reads) {
    return channel_->PushPull(request.computed_at, request.gradients, request.min_versions,
                              request.timeout, request.values, versions, responses,
                              StepRows{request.push_rows, request.pull_rows});
  }
  if (pushes) {
    if (request.gradients.empty() && !request.push_rows.empty()) {
      return channel_->PushRows(request.computed_at, request.push_rows, responses);
    }
    return channel_->Push(request.computed_at, request.gradients, responses, request.push_rows);
  }
  if (reads) {
    if (request.values.empty() && !request.pull_rows.empty()) {
      return channel_->PullRows(request.min_versions, request.timeout, request.pull_rows, versions);
    }
    return channel_->Pull(request.min_versions, request.timeout, request.values, versions,
                          request.pull_rows);
  }
  return absl::InvalidArgumentError(
      "an exchange names neither a push (computed_at) nor a read (min_versions)");
}

absl::StatusOr<std::unique_ptr<StepExchange>> PsClient::BeginExchange(
    const ExchangeRequest& request, const std::vector<int>& push_order) {
  return channel_->BeginExchange(request.computed_at, request.gradients, push_order,
                                 request.min_versions, request.timeout, request.values,
                                 StepRows{request.push_rows, request.pull_rows});
}

absl::Status PsClient::Heartbeat() { return channel_->Heartbeat(); }
absl::Status PsClient::Heartbeat(int shard) { return channel_->Heartbeat(shard); }
absl::Status PsClient::Done() { return channel_->Done(); }
absl::StatusOr<StatsResponse> PsClient::Stats(int shard, std::string* answered_by) {
  return channel_->Stats(shard, answered_by);
}
absl::StatusOr<StatsResponse> PsClient::AwaitWorkersDone(int shard, int64_t known_changes,
                                                         absl::Duration timeout) {
  return channel_->AwaitWorkersDone(shard, known_changes, timeout);
}
absl::StatusOr<CheckpointResponse> PsClient::Checkpoint(int shard) {
  return channel_->Checkpoint(shard);
}
absl::Status PsClient::Shutdown(int shard) { return channel_->Shutdown(shard); }

}  // namespace pst
