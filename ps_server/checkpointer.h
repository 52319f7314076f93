// Takes a shard's checkpoints: periodically (every N versions and/or every
// T seconds), on demand, and once more at shutdown.
#ifndef PST_PS_SERVER_CHECKPOINTER_H_
#define PST_PS_SERVER_CHECKPOINTER_H_

#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "config.pb.h"
#include "ps_server/parameter_shard.h"

namespace pst {

class Checkpointer {
 public:
  // `shard` must outlive the Checkpointer. Checkpoints go to
  // <config.dir>/shard-<index>/.
  Checkpointer(ParameterShard* shard, const CheckpointConfig& config, int index);
  ~Checkpointer();

  // Restores the newest valid checkpoint into the shard, logging each one
  // rejected as torn or corrupted. Returns the restored version, or NotFound
  // when there is nothing to restore.
  absl::StatusOr<int64_t> RestoreNewest();

  // Starts the periodic thread (no-op when neither interval is set).
  void Start();

  struct Written {
    std::string path;
    int64_t version;
  };
  // Writes a checkpoint of the current state now.
  absl::StatusOr<Written> CheckpointNow();

  // Stops the thread and writes a final checkpoint if the version moved.
  void Stop();

 private:
  void Loop();
  absl::StatusOr<Written> Write(const ShardCheckpoint& checkpoint);

  ParameterShard* shard_;
  const CheckpointConfig config_;
  const std::string dir_;
  absl::Mutex mu_;  // serializes writers
  int64_t last_version_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace pst

#endif  // PST_PS_SERVER_CHECKPOINTER_H_
