// slow_worker: the worker binary with a delay in every step, to play a
// straggler among real processes. Takes the worker's flags, and
//   --step_delay_ms=N   sleep N ms in every step, between computing the
//                       gradients and pushing them.
#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/process_memory.h"
#include "rpc/grpc_experiments.h"
#include "worker/process/worker_process.h"

ABSL_FLAG(int, step_delay_ms, 0,
          "Sleep this long in every step, between computing the gradients and pushing them.");

int main(int argc, char** argv) {
  pst::KeepLargeBuffersWarm();
  pst::EnableTransportExperiments();
  return pst::RunWorkerProcess(
      argc, argv, {.before_push = [] {
        absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_step_delay_ms)));
      }});
}
