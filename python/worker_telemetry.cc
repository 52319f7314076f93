#include "python/worker_telemetry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/client/worker_metrics.h"

namespace pst {

void NameWorkerProcess(int worker) {
  if (metrics::ProcessLabels().empty()) {
    metrics::SetProcessLabels(
        {{"task", absl::StrCat("worker:", worker)}, {"worker", std::to_string(worker)}});
  }
  GetWorkerMetrics();
}

absl::StatusOr<std::unique_ptr<WorkerTelemetry>> WorkerTelemetry::Start(const Options& options) {
  NameWorkerProcess(options.worker);
  std::unique_ptr<WorkerTelemetry> telemetry(new WorkerTelemetry());
  const std::string task = absl::StrCat("worker:", options.worker);
  if (options.metrics_port) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> server = metrics::MetricsServer::Start(
        &metrics::GlobalExposition(), options.metrics_address, *options.metrics_port);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("metrics port: ", server.status().message()));
    }
    telemetry->server_ = *std::move(server);
    const std::string& address = options.metrics_address;
    spdlog::info("{} metrics on http://{}:{}/metrics", task,
                 address.find(':') == std::string::npos ? address : "[" + address + "]",
                 telemetry->server_->port());
    if (std::optional<std::string> warning =
            metrics::ExposureWarning(address, telemetry->server_->port(), options.cluster_tls)) {
      spdlog::warn("{}", *warning);
    }
  }
  if (!options.logdir.empty()) {
    PST_ASSIGN_OR_RETURN(telemetry->events_, EventWriter::Open(options.logdir));
    spdlog::info("TensorBoard events: {}", telemetry->events_->path());
  }
  telemetry->recorder_ = std::make_unique<RunRecorder>(telemetry->events_.get());
  telemetry->window_start_ = absl::Now();
  return telemetry;
}

void WorkerTelemetry::RecordWindow(int64_t step, double loss, int64_t samples, double staleness,
                                   int64_t version, const std::vector<std::string>& names,
                                   const std::vector<std::span<const float>>& gradients) {
  const absl::Time now = absl::Now();
  const double seconds = std::max(absl::ToDoubleSeconds(now - window_start_), 1e-9);
  window_start_ = now;
  GetWorkerMetrics().samples.Increment(static_cast<double>(samples));
  RecordGradientNorms(names, gradients);
  recorder_->OnWindow({step, loss, static_cast<double>(samples) / seconds, staleness, version},
                      &result_);
}

void WorkerTelemetry::RecordEvaluation(int epochs_done, int64_t step, double test_loss,
                                       std::optional<double> accuracy) {
  recorder_->OnEvaluation(epochs_done, step, test_loss, accuracy, &result_);
}

}  // namespace pst
