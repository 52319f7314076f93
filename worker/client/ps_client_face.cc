// PsClient: its calls handed to the transport (worker/client/shard_channel.h).
#include <utility>

#include "common/status_macros.h"
#include "worker/client/ps_client.h"
#include "worker/client/shard_channel.h"

namespace pst {

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(
    const std::vector<std::string>& addresses, int worker, absl::Duration connect_timeout,
    const ClusterSecurity& security) {
  PST_ASSIGN_OR_RETURN(std::unique_ptr<ShardChannel> channel,
                       ShardChannel::Connect(addresses, worker, connect_timeout, security));
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

absl::Status PsClient::Pull(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                            const std::vector<std::span<float>>& out,
                            std::vector<int64_t>* versions, std::span<const RowValues> rows) {
  return channel_->Pull(min_versions, timeout, out, versions, rows);
}

absl::Status PsClient::PullRows(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                                std::span<const RowValues> rows, std::vector<int64_t>* versions) {
  return channel_->PullRows(min_versions, timeout, rows, versions);
}

absl::Status PsClient::Push(const std::vector<int64_t>& computed_at,
                            const std::vector<std::span<const float>>& gradients,
                            std::vector<PushResponse>* responses,
                            std::span<const RowGradients> rows) {
  return channel_->Push(computed_at, gradients, responses, rows);
}

absl::Status PsClient::PushRows(const std::vector<int64_t>& computed_at,
                                std::span<const RowGradients> rows,
                                std::vector<PushResponse>* responses) {
  return channel_->PushRows(computed_at, rows, responses);
}

absl::Status PsClient::PushPull(const std::vector<int64_t>& computed_at,
                                const std::vector<std::span<const float>>& gradients,
                                const std::vector<int64_t>& min_versions, absl::Duration timeout,
                                const std::vector<std::span<float>>& out,
                                std::vector<int64_t>* versions,
                                std::vector<PushResponse>* responses, const StepRows& rows) {
  return channel_->PushPull(computed_at, gradients, min_versions, timeout, out, versions,
                            responses, rows);
}

absl::StatusOr<std::unique_ptr<StepExchange>> PsClient::BeginExchange(
    const std::vector<int64_t>& computed_at,
    const std::vector<std::span<const float>>& gradients, const std::vector<int>& push_order,
    const std::vector<int64_t>& min_versions, absl::Duration timeout,
    const std::vector<std::span<float>>& out, const StepRows& rows) {
  return channel_->BeginExchange(computed_at, gradients, push_order, min_versions, timeout, out,
                                 rows);
}

absl::Status PsClient::Heartbeat() { return channel_->Heartbeat(); }
absl::Status PsClient::Heartbeat(int shard) { return channel_->Heartbeat(shard); }
absl::Status PsClient::Done() { return channel_->Done(); }
absl::StatusOr<StatsResponse> PsClient::Stats(int shard) { return channel_->Stats(shard); }
absl::StatusOr<StatsResponse> PsClient::AwaitWorkersDone(int shard, int64_t known_changes,
                                                         absl::Duration timeout) {
  return channel_->AwaitWorkersDone(shard, known_changes, timeout);
}
absl::StatusOr<CheckpointResponse> PsClient::Checkpoint(int shard) {
  return channel_->Checkpoint(shard);
}
absl::Status PsClient::Shutdown(int shard) { return channel_->Shutdown(shard); }

}  // namespace pst
