// The worker process, as the `worker` binary runs it:
//   worker --config=cluster.textproto --task=worker:0 [--result_file=out.json]
// parses the flags, loads and checks the config, opens the devices, loads
// the data, connects to every PS shard and trains its shard of the data;
// it returns 0 when its epochs are done (the chief, worker:0, after the
// final evaluation). An error exits the process with one line
// (common/exit.h).
#ifndef PST_WORKER_PROCESS_WORKER_PROCESS_H_
#define PST_WORKER_PROCESS_WORKER_PROCESS_H_

#include <functional>

namespace pst {

// What a caller adds to the training loop (worker/training/trainer.h).
struct WorkerProcessHooks {
  // Trainer::set_before_push.
  std::function<void()> before_push;
};

// Runs the worker with the command line `argc`/`argv`; returns the exit
// code. Call KeepLargeBuffersWarm (common/process_memory.h) first, and no
// thread before: where OpenBLAS misjudges this CPU it executes the program
// again (kernels/openblas_core.h).
int RunWorkerProcess(int argc, char** argv, const WorkerProcessHooks& hooks = {});

}  // namespace pst

#endif  // PST_WORKER_PROCESS_WORKER_PROCESS_H_
