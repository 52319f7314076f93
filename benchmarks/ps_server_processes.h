// ps_server shards for a benchmark, each a process of its own on a free
// loopback port, as a deployment runs them: ASYNC, plaintext, SGD with
// learning rate 1 unless told another optimizer. Shards that are threads of the benchmark instead would share
// its gRPC pollers with the workers, which a real worker never does.
//
// The processes are started from the executable beside the benchmark's own,
// write their output to a log in a private temporary directory, die with
// the benchmark (PR_SET_PDEATHSIG), and are stopped by PID (SIGTERM, then
// SIGKILL) when the object is destroyed.
#ifndef PST_BENCHMARKS_PS_SERVER_PROCESSES_H_
#define PST_BENCHMARKS_PS_SERVER_PROCESSES_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pst {

struct PsServerOptions {
  int shards = 1;
  int workers = 1;
  int64_t max_message_bytes = int64_t{1} << 30;
  // training.optimizer, as text.
  std::string optimizer = "sgd { learning_rate: 1.0 }";
  // Whether the shards write checkpoints (under dir(), on demand only:
  // PsClient::Checkpoint).
  bool checkpoints = false;
  // Their training.checkpoint.full_every: with more than 1, checkpoints
  // after the first are deltas, until the chain is that long.
  int full_every = 0;
};

class PsServerProcesses {
 public:
  // Starts `shards` ps_server processes for `workers` workers, each taking
  // requests of up to `max_message_bytes`, and waits until every one
  // accepts connections. The error names the shard that did not come up
  // and ends with its log.
  static absl::StatusOr<std::unique_ptr<PsServerProcesses>> Start(int shards, int workers,
                                                                    int64_t max_message_bytes);
  static absl::StatusOr<std::unique_ptr<PsServerProcesses>> Start(const PsServerOptions& options);
  ~PsServerProcesses();

  PsServerProcesses(const PsServerProcesses&) = delete;
  PsServerProcesses& operator=(const PsServerProcesses&) = delete;

  // "127.0.0.1:<port>", one per shard.
  const std::vector<std::string>& addresses() const { return addresses_; }

  // User plus system CPU time the shards have used so far.
  double CpuSeconds() const;
  // The shards' resident memory now, summed.
  int64_t ResidentBytes() const;

  // The shards' process IDs, in shard order.
  const std::vector<pid_t>& pids() const { return pids_; }

  // Where their config and logs are; removed with the object.
  const std::string& dir() const { return dir_; }

 private:
  PsServerProcesses() = default;
  absl::Status StartShard(int shard, const std::string& config_path, int64_t max_message_bytes);

  std::string dir_;
  std::vector<pid_t> pids_;  // -1: reaped already
  std::vector<std::string> addresses_;
  std::vector<std::string> logs_;
};

}  // namespace pst

#endif  // PST_BENCHMARKS_PS_SERVER_PROCESSES_H_
