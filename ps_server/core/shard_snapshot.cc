#include "ps_server/core/shard_snapshot.h"

#include <utility>

namespace pst {

ShardCheckpoint ShardSnapshot::Finish() && {
  for (auto& part : later) std::move(part)(&checkpoint);
  later.clear();
  return std::move(checkpoint);
}

}  // namespace pst
