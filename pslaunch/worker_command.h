// Worker tasks that run a command of the user's (cluster.worker_command),
// such as a Python script training with the pstrain module, instead of the
// worker binary.
#ifndef PST_PSLAUNCH_WORKER_COMMAND_H_
#define PST_PSLAUNCH_WORKER_COMMAND_H_

#include <string>

#include "pslaunch/supervisor.h"

namespace pst {

// Makes `task`, a worker task started as `worker --name=value ...`, run
// `command` through `/bin/sh -c` instead, so that the command may hold
// arguments, quotes and redirections as a shell line does. Its flags become
// its environment: --name=value sets PSTRAIN_<NAME> (upper-cased), so the
// command finds PSTRAIN_CONFIG, PSTRAIN_TASK and PSTRAIN_RESULT_FILE, and
// PSTRAIN_LOGDIR and PSTRAIN_METRICS_PORT when pslaunch passes those. As
// torchrun does, it also sets RANK and LOCAL_RANK (the worker's index) and
// WORLD_SIZE and LOCAL_WORLD_SIZE (`workers`: every worker is on this
// host), by which a script shards its data (pstrain.torch.DistributedSampler).
// Everything else (restarts, output prefixes, the token) stays as it was.
void RunWorkerCommand(const std::string& command, int workers, ChildSpec* task);

}  // namespace pst

#endif  // PST_PSLAUNCH_WORKER_COMMAND_H_
