// A worker's client of every PS shard: the face a trainer or a session
// includes. No gRPC here; the transport (gRPC, the shared-memory and socket
// paths, the shard map) lies behind it in worker/client/shard_channel.h.
//
// Contract. Each exchange (Exchange, BeginExchange) is one Exchange call
// per shard, all in flight at once, on the caller's spans (or where
// AllocateTensors put them in a shared region), rows split by shard and
// scattered back in the caller's order.
// A call returns OK once every shard answered, or its first shard's error,
// named ("ps:S (address): ...") and classified (TransientRefusalOf); an
// exchange whose part at one shard failed cancels its other parts rather
// than await their answers (a SYNC read there may wait on a step the
// failed shard holds up). It
// retries nothing but Init, Done and AwaitWorkersDone (refusals for now,
// within set_call_patience) and an exchange whose shard lost the worker's
// region (once, with a new one). It never changes versions or decides what
// to wait for (worker/session/training_session.h does), never pieces a
// push (one past a shard's request limit is refused before it is sent),
// and runs one exchange call at a time; the other calls may run beside it.
#ifndef PST_WORKER_CLIENT_PS_CLIENT_H_
#define PST_WORKER_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "common/transient_refusal.h"
#include "config.pb.h"
#include "placement/placement.h"
#include "placement/variable_spec.h"
#include "ps.pb.h"
#include "worker/client/row_split.h"
#include "worker/client/step_exchange.h"

namespace pst {

// The refusal for now a failed call is, if any: the shard's mark, or by
// code alone a shard away or stopping (UNAVAILABLE; CANCELLED from a shard).
std::optional<TransientRefusal> TransientRefusalOf(const absl::Status& status);
inline bool IsTransientShardError(const absl::Status& status) {
  return TransientRefusalOf(status).has_value();
}
// Whether `status` already names the shard it came from.
bool NamesItsShard(const absl::Status& status);
// One step's rows: step s's row gradients up, step s+1's ids' rows down.
struct StepRows {
  std::span<const RowGradients> push = {};
  std::span<const RowValues> pull = {};
};
// One exchange with every shard. The push: a gradient per variable (or
// none: rows alone) and row gradients, tagged computed_at (one version per
// shard; empty: no push). The read: values per variable (or none: rows
// alone) and the rows of pull_rows, at min_versions (one per shard; empty:
// no read).
struct ExchangeRequest {
  std::vector<int64_t> computed_at = {};
  std::vector<std::span<const float>> gradients = {};
  std::span<const RowGradients> push_rows = {};
  std::vector<int64_t> min_versions = {};
  absl::Duration timeout = absl::ZeroDuration();
  std::vector<std::span<float>> values = {};
  std::span<const RowValues> pull_rows = {};
};
// Each shard's backups' addresses (cluster.ps_backups); empty lists where none.
std::vector<std::vector<std::string>> ShardBackups(const ClusterConfig& cluster);

class ShardChannel;  // the transport: worker/client/shard_channel.h

class PsClient {
 public:
  // Connects to every shard within `connect_timeout` (else Unavailable).
  // `backups[s]` (ShardBackups) lists shard s's backups: it is reached at
  // any replica, and Register (so every rejoin) finds its primary.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const std::vector<std::string>& addresses, int worker, absl::Duration connect_timeout,
      const ClusterSecurity& security = ClusterSecurity::Plaintext(),
      const std::vector<std::vector<std::string>>& backups = {});
  ~PsClient();

  // kAuto: shared memory with every shard that can share it, TCP to the
  // rest; kTcp; kShm (a shard that cannot share fails the call).
  enum class Transport { kAuto, kTcp, kShm };
  // Settings, before AllocateTensors: the tensors' wire type (FLOAT32), the
  // transport (kTcp), how long the unary calls wait out refusals (0).
  void set_wire_dtype(DType dtype);
  void set_transport(Transport transport);
  void set_call_patience(absl::Duration patience);

  int num_shards() const;
  int worker() const;
  const std::string& address(int shard) const;
  bool uses_shared_memory(int shard) const;  // known once the shard is reached

  // The model's variables, placed as every process places them, and its
  // embedding tables (RowGradients and RowValues name a table by index).
  void SetVariables(const std::vector<VariableSpec>& variables);
  const std::vector<VariableSlice>& slices() const;
  void SetEmbeddingTables(std::vector<EmbeddingTableConfig> tables);
  const std::vector<EmbeddingTableConfig>& embedding_tables() const;
  int FindEmbeddingTable(absl::string_view name) const;  // -1: none

  // Memory for each variable's gradient and values, in a co-located shard's
  // region where it lies whole on one: valid, at the same address, for the
  // client's life. Once, after the settings and SetVariables.
  struct Tensors {
    std::vector<std::span<float>> gradients;
    std::vector<std::span<float>> values;
  };
  absl::StatusOr<Tensors> AllocateTensors();

  absl::StatusOr<RegisterResponse> Register();  // with every shard; shard 0's answer
  // Offers initial values, tables, rows and the dense variables' optimizer
  // (nullopt: the job's); whether shard 0 took them. Later pushes carry
  // `rates` (UpdateRates, by variable or table name).
  void SetDenseOptimizer(std::optional<OptimizerConfig> optimizer);
  absl::StatusOr<bool> Init(const std::vector<std::span<const float>>& values,
                            std::span<const RowGradients> initial_rows = {});
  absl::Status SetUpdateRates(const std::optional<UpdateRates>& rates);

  // The exchange: one call per shard, pushing, reading or both (the read's
  // values then include the push). A read waits on shard s until its
  // version reaches min_versions[s], for at most `timeout`, and fills
  // `versions`; a push is tagged computed_at[s] and fills `responses`
  // (either may be null where the request has no read or no push). Rows
  // are checked before anything is sent (InvalidArgument).
  absl::Status Exchange(const ExchangeRequest& request, std::vector<int64_t>* versions,
                        std::vector<PushResponse>* responses);
  // A push-and-read exchange fed layer by layer in `push_order`
  // (worker/client/step_exchange.h).
  absl::StatusOr<std::unique_ptr<StepExchange>> BeginExchange(const ExchangeRequest& request,
                                                              const std::vector<int>& push_order);

  // Control and admin calls. Stats, Checkpoint and Shutdown of a
  // replicated shard find its primary, whichever replica that is now
  // (`answered_by`, if set, gets its address); Shutdown stops every replica.
  absl::Status Heartbeat();
  absl::Status Heartbeat(int shard);
  absl::Status Done();
  absl::StatusOr<StatsResponse> Stats(int shard, std::string* answered_by = nullptr);
  // Stats once every worker is done or `known_changes` is past, or at `timeout`.
  absl::StatusOr<StatsResponse> AwaitWorkersDone(int shard, int64_t known_changes,
                                                 absl::Duration timeout);
  absl::StatusOr<CheckpointResponse> Checkpoint(int shard);
  absl::Status Shutdown(int shard);

 private:
  explicit PsClient(std::unique_ptr<ShardChannel> channel);
  const std::unique_ptr<ShardChannel> channel_;
};

}  // namespace pst

#endif  // PST_WORKER_CLIENT_PS_CLIENT_H_
