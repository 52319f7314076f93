#include "ps_server/core/snapshot_schedule.h"

#include <utility>

namespace pst {

void SnapshotSchedule::Schedule(ShardSnapshot snapshot) {
  scheduled_ = std::move(snapshot);
  unwritten_ = writer_attached_;
  changed_.SignalAll();
}

void SnapshotSchedule::DetachWriter() {
  writer_attached_ = false;
  unwritten_ = false;
}

std::optional<ShardSnapshot> SnapshotSchedule::Take(absl::Time deadline,
                                                      absl::FunctionRef<bool()> stop) {
  while (!scheduled_ && !stop()) {
    if (changed_.WaitWithDeadline(mu_, deadline)) break;
  }
  std::optional<ShardSnapshot> snapshot = std::move(scheduled_);
  scheduled_.reset();
  return snapshot;
}

}  // namespace pst
