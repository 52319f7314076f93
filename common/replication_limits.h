// What a replicated shard's primary and its workers agree on
// (ps_server/core/parameter_shard.h, "Replicas").
#ifndef PST_COMMON_REPLICATION_LIMITS_H_
#define PST_COMMON_REPLICATION_LIMITS_H_

#include <cstdint>

namespace pst {

// A primary holds updates back while a live backup is this many versions
// behind: so far at most can a worker's read run ahead of what a backup
// that takes over holds.
inline constexpr int64_t kMaxUnreplicatedVersions = 16;

}  // namespace pst

#endif  // PST_COMMON_REPLICATION_LIMITS_H_
