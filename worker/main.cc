// worker: one training process (worker/process/worker_process.h).
#include "common/mutex_checks.h"
#include "common/process_memory.h"
#include "rpc/grpc_experiments.h"
#include "worker/process/worker_process.h"

int main(int argc, char** argv) {
  pst::KeepLargeBuffersWarm();
  pst::SkipMutexDeadlockChecks();
  pst::EnableTransportExperiments();
  return pst::RunWorkerProcess(argc, argv);
}
