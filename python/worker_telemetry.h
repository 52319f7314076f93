// What a Python worker reports beside its exchanges, as the worker binary
// does (worker/process/worker_process.cc): the process's metrics (worker/
// worker_metrics.h, labelled task="worker:N" worker="N") on a Prometheus
// endpoint (common/metrics_http.h), and, for the chief, TensorBoard events
// (worker/report/event_writer.h). The metric names, labels, endpoint and event
// tags are the C++ worker's, so pslaunch's --metrics_port and --logdir
// serve a cluster.worker_command job as they serve the built-in one.
//
// The exchanges record their own metrics (worker/session/client_session.h); this
// adds the training loop's: progress windows (loss, throughput, staleness,
// gradient norms) and evaluations, and keeps them as the curve points a
// worker result carries.
#ifndef PST_PYTHON_WORKER_TELEMETRY_H_
#define PST_PYTHON_WORKER_TELEMETRY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics_http.h"
#include "result.pb.h"
#include "worker/report/event_writer.h"
#include "worker/report/run_recorder.h"

namespace pst {

// Names this process's metrics after worker `worker` (task="worker:N"
// worker="N") unless a name was given already, and registers the worker's
// metrics, so that every one is scraped from the start, at zero. A process
// that opens several sessions is named after the first.
void NameWorkerProcess(int worker);

class WorkerTelemetry {
 public:
  struct Options {
    int worker = 0;
    // The metrics endpoint: none without a port; 0 picks a free one.
    std::optional<int> metrics_port;
    std::string metrics_address = "127.0.0.1";
    // TensorBoard events go to this folder (none when empty).
    std::string logdir;
    // Whether the cluster's RPCs use TLS (warned of an endpoint others can reach).
    bool cluster_tls = false;
  };
  // Starts the endpoint and opens the event file the options ask for.
  // InvalidArgument for an address that is not a literal, Unavailable for a
  // port that cannot be bound or a folder that cannot be written.
  static absl::StatusOr<std::unique_ptr<WorkerTelemetry>> Start(const Options& options);

  // The endpoint's port (0: none) and the event file's path (empty: none).
  int metrics_port() const { return server_ ? server_->port() : 0; }
  std::string events_path() const { return events_ ? events_->path() : ""; }

  // The steps since the last window, as the C++ trainer's progress window
  // records them: `samples` examples, mean `loss` and `staleness`, ending
  // at `step` with shard 0 at `version`; throughput over the time since the
  // last window (or Start). Gradient norms of `gradients[i]`, named `names[i]`.
  void RecordWindow(int64_t step, double loss, int64_t samples, double staleness,
                    int64_t version, const std::vector<std::string>& names,
                    const std::vector<std::span<const float>>& gradients);
  // An evaluation after `epochs_done` epochs, at `step`.
  void RecordEvaluation(int epochs_done, int64_t step, double test_loss,
                        std::optional<double> accuracy);

  // The curve and evaluation points recorded so far, as a worker result
  // holds them.
  const WorkerResult& result() const { return result_; }

 private:
  WorkerTelemetry() = default;

  std::unique_ptr<metrics::MetricsServer> server_;
  std::unique_ptr<EventWriter> events_;
  std::unique_ptr<RunRecorder> recorder_;
  absl::Time window_start_;
  WorkerResult result_;
};

}  // namespace pst

#endif  // PST_PYTHON_WORKER_TELEMETRY_H_
