// When a shard copies its state for a checkpoint, and how long that holds
// its updates back (parameter_shard.h).
//
// Every `every_steps` versions the shard hands the schedule a snapshot,
// which waits for the checkpoint writer to take it (a newer one replaces one
// not taken). While a writer is attached, a scheduled snapshot holds every
// update until the writer reports it written (or failed), so the newest
// checkpoint on disk is never more than `every_steps` versions behind: a
// crash loses at most that. The hold lasts one checkpoint write per
// `every_steps`.
//
// Not thread-safe on its own: it shares its owner's mutex, and every method
// but the constructor is called with it held (Take waits on it).
#ifndef PST_PS_SERVER_CORE_SNAPSHOT_SCHEDULE_H_
#define PST_PS_SERVER_CORE_SNAPSHOT_SCHEDULE_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ps.pb.h"
#include "ps_server/core/shard_snapshot.h"

namespace pst {

class SnapshotSchedule {
 public:
  // `every_steps` 0: never. `*mu` is the owner's and must outlive this.
  SnapshotSchedule(int64_t every_steps, absl::Mutex* mu) : every_steps_(every_steps), mu_(mu) {}

  // Whether the shard snapshots at `version`.
  bool Due(int64_t version) const {
    return every_steps_ > 0 && version % every_steps_ == 0;
  }
  // The snapshot due now, for the writer; with a writer attached, updates
  // wait until it is written.
  void Schedule(ShardSnapshot snapshot);
  // Whether updates wait for a scheduled snapshot to be written.
  bool holds_updates() const { return unwritten_; }

  // The writer's side. Detaching, and a write, release the updates held;
  // the owner then wakes them.
  void AttachWriter() { writer_attached_ = true; }
  // Whether a writer takes the snapshots scheduled (so each is written).
  bool writer_attached() const { return writer_attached_; }
  void DetachWriter();
  void Written() { unwritten_ = false; }
  // Waits up to `deadline`, or until `stop()`, for the next snapshot and
  // hands it over; nullopt if none came. `stop` is read with the mutex
  // held, after each Wake.
  std::optional<ShardSnapshot> Take(absl::Time deadline, absl::FunctionRef<bool()> stop);
  // The owner's state changed: a Take looks at `stop` again.
  void Wake() { changed_.SignalAll(); }

  // What Stats reports of the writer.
  const CheckpointStats& stats() const { return stats_; }
  void set_stats(const CheckpointStats& stats) { stats_ = stats; }

 private:
  const int64_t every_steps_;
  absl::Mutex* const mu_;
  absl::CondVar changed_;
  std::optional<ShardSnapshot> scheduled_;
  bool writer_attached_ = false;
  bool unwritten_ = false;
  CheckpointStats stats_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_SNAPSHOT_SCHEDULE_H_
