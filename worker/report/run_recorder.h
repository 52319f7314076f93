// What a worker keeps of its run besides the progress lines: curve points in
// its WorkerResult (for pslaunch's report page), TensorBoard scalars (the
// chief, with --logdir) and the metrics gauges.
#ifndef PST_WORKER_REPORT_RUN_RECORDER_H_
#define PST_WORKER_REPORT_RUN_RECORDER_H_

#include <cstdint>
#include <optional>

#include "absl/time/time.h"
#include "result.pb.h"
#include "worker/report/event_writer.h"

namespace pst {

// One progress window: means over the steps since the last window.
struct Window {
  int64_t step = 0;  // steps done, over all epochs
  double loss = 0.0;
  double samples_per_sec = 0.0;
  double staleness = 0.0;
  int64_t version = 0;
};

class RunRecorder {
 public:
  // `events` may be null (no TensorBoard output); it must outlive this.
  explicit RunRecorder(EventWriter* events);

  void OnWindow(const Window& window, WorkerResult* result);
  // `accuracy` is absent for regression jobs.
  void OnEvaluation(int epochs_done, int64_t step, double test_loss,
                    std::optional<double> accuracy, WorkerResult* result);

 private:
  void Scalar(const char* tag, int64_t step, double value);

  EventWriter* events_;
  const absl::Time start_;
};

}  // namespace pst

#endif  // PST_WORKER_REPORT_RUN_RECORDER_H_
