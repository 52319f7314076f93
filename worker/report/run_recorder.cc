#include "worker/report/run_recorder.h"

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "worker/client/worker_metrics.h"

namespace pst {

RunRecorder::RunRecorder(EventWriter* events) : events_(events), start_(absl::Now()) {}

void RunRecorder::OnWindow(const Window& window, WorkerResult* result) {
  CurvePoint* point = result->add_curve();
  point->set_step(window.step);
  point->set_seconds(absl::ToDoubleSeconds(absl::Now() - start_));
  point->set_loss(window.loss);
  point->set_samples_per_sec(window.samples_per_sec);
  point->set_staleness(window.staleness);

  WorkerMetrics& m = GetWorkerMetrics();
  m.loss.Set(window.loss);
  m.samples_per_second.Set(window.samples_per_sec);

  Scalar("train/loss", window.step, window.loss);
  Scalar("train/samples_per_sec", window.step, window.samples_per_sec);
  Scalar("train/staleness", window.step, window.staleness);
}

void RunRecorder::OnEvaluation(int epochs_done, int64_t step, double test_loss,
                               std::optional<double> accuracy, WorkerResult* result) {
  EvalPoint* point = result->add_evals();
  point->set_epoch(epochs_done);
  point->set_step(step);
  point->set_seconds(absl::ToDoubleSeconds(absl::Now() - start_));
  point->set_test_loss(test_loss);
  point->set_has_test_accuracy(accuracy.has_value());
  point->set_test_accuracy(accuracy.value_or(0.0));
  Scalar("test/loss", step, test_loss);
  if (accuracy) Scalar("test/accuracy", step, *accuracy);
}

void RunRecorder::Scalar(const char* tag, int64_t step, double value) {
  if (events_ == nullptr) return;
  if (absl::Status s = events_->AddScalar(tag, step, static_cast<float>(value)); !s.ok()) {
    // Training matters more than its curves: say so once and stop writing.
    spdlog::warn("{}; no more TensorBoard events are written", std::string(s.message()));
    events_ = nullptr;
  }
}

}  // namespace pst
