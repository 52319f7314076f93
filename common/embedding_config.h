// Embedding table specs (EmbeddingTableConfig in proto/config.proto),
// checked, with their documented defaults filled in. Config validation
// refuses exactly what this refuses, and the PS builds its tables from
// what this returns, so a spec that loads is one every PS can hold.
#ifndef PST_COMMON_EMBEDDING_CONFIG_H_
#define PST_COMMON_EMBEDDING_CONFIG_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "config.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace pst {

inline constexpr int64_t kDefaultMaxRowsPerShard = int64_t{1} << 22;
// A row is indexed by 32 bits within its shard.
inline constexpr int64_t kMaxRowsPerShard = (int64_t{1} << 32) - 1;
inline constexpr int32_t kMaxEmbeddingDim = 1 << 16;

// `spec` with every default set: optimizer (the job's `job_optimizer` when
// unset), max_rows_per_shard and init_scale. InvalidArgument naming the
// table for an empty name, a dim outside [1, kMaxEmbeddingDim], a row limit
// outside [0, kMaxRowsPerShard], a negative or non-finite init_scale, a
// negative storage.memory_bytes or storage.ttl_steps, storage.disk with
// REFUSE_NEW_ROWS or a name with '/', parts without a name, with a dim
// below 1, a negative or non-finite init_scale, a name used twice or dims
// that do not add up to dim, or an optimizer
// ResolveOptimizerConfig (common/optimizer_config.h) refuses. Whether
// storage.disk is writable is the PS's check (CheckTaskFiles).
absl::StatusOr<EmbeddingTableConfig> ResolveEmbeddingTable(const EmbeddingTableConfig& spec,
                                                           const OptimizerConfig& job_optimizer);

// Every spec resolved, in order; InvalidArgument also for a name used twice.
absl::StatusOr<std::vector<EmbeddingTableConfig>> ResolveEmbeddingTables(
    const google::protobuf::RepeatedPtrField<EmbeddingTableConfig>& specs,
    const OptimizerConfig& job_optimizer);

}  // namespace pst

#endif  // PST_COMMON_EMBEDDING_CONFIG_H_
