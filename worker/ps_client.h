// A worker's connection to every PS shard of the cluster.
//
// The client knows where each variable lives (common/partitioner.h) and
// speaks to all shards in parallel: one Pull or Push call here is one RPC
// per shard, all in flight at once. Values move straight between the
// caller's buffers and the wire payloads.
#ifndef PST_WORKER_PS_CLIENT_H_
#define PST_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "ps.grpc.pb.h"

namespace pst {

struct VariableSpec;

class PsClient {
 public:
  // Opens channels to `addresses` (cluster.ps) and waits up to
  // `connect_timeout` for every shard to accept a connection, over the
  // channels `security` describes. Unavailable, naming the shard, if one
  // cannot be reached.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const std::vector<std::string>& addresses, int worker, absl::Duration connect_timeout,
      const ClusterSecurity& security = ClusterSecurity::Plaintext());

  // How gradients and pulled parameters travel (default FLOAT32).
  void set_wire_dtype(DType dtype) { wire_dtype_ = dtype; }

  int num_shards() const { return static_cast<int>(shards_.size()); }
  int worker() const { return worker_; }

  // Declares the model's variables, in order, and places them on shards.
  // With several shards, a variable over kSliceBytes is cut along its first
  // dimension into one slice per shard ("<name>/part-<i>"), so one big
  // matrix does not load one shard alone; slices and small variables are
  // then spread by size (common/partitioner.h). Every process computes the
  // same placement from the same model.
  void SetVariables(const std::vector<VariableSpec>& variables);

  // A contiguous piece of one model variable, as one PS shard stores it.
  struct Slice {
    size_t variable;  // index into the model's variables
    int64_t offset;   // first element within the variable
    int64_t count;
    std::string name;
    std::vector<int64_t> shape;
    int shard;
  };
  const std::vector<Slice>& slices() const { return slices_; }

  static constexpr int64_t kSliceBytes = 64 << 10;

  // Registers with every shard; returns shard 0's answer.
  absl::StatusOr<RegisterResponse> Register();

  // Offers initial values (one span per variable) to every shard; a shard
  // that already has values keeps them. Returns whether shard 0 accepted.
  absl::StatusOr<bool> Init(const std::vector<std::span<const float>>& values);

  // Pulls every variable into `out` (one span per variable, sized like the
  // variable), waiting on shard s until its version is >= min_versions[s]
  // for at most `timeout`. Fills `versions` with each shard's version.
  absl::Status Pull(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                    const std::vector<std::span<float>>& out, std::vector<int64_t>* versions);

  // Pushes one gradient per variable; shard s's gradients are tagged with
  // computed_at[s]. Fills `responses` with each shard's answer.
  absl::Status Push(const std::vector<int64_t>& computed_at,
                    const std::vector<std::span<const float>>& gradients,
                    std::vector<PushResponse>* responses);

  // Tells every shard this worker is alive (it may be computing a long step).
  absl::Status Heartbeat();

  // Tells every shard this worker has finished.
  absl::Status Done();

  absl::StatusOr<StatsResponse> Stats(int shard);

  // Admin calls, one shard at a time.
  absl::StatusOr<CheckpointResponse> Checkpoint(int shard);
  absl::Status Shutdown(int shard);
  const std::string& address(int shard) const { return shards_[shard].address; }

 private:
  struct Shard {
    std::string address;
    std::unique_ptr<ParameterServer::Stub> stub;
    std::vector<size_t> slices;  // indices into slices_, in order
  };
  PsClient(int worker) : worker_(worker) {}

  // Runs call(s) for every shard s concurrently and waits for all; the first
  // failure, prefixed with the shard's name, is returned.
  template <typename Call>
  absl::Status ForEachShard(Call call);
  absl::Status ShardError(int shard, const grpc::Status& status) const;

  int worker_;
  DType wire_dtype_ = FLOAT32;
  std::vector<Shard> shards_;
  std::vector<Slice> slices_;
};

}  // namespace pst

#endif  // PST_WORKER_PS_CLIENT_H_
