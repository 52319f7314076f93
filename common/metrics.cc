#include "common/metrics.h"

#include <sstream>

#include "prometheus/text_serializer.h"

namespace pst::metrics {
namespace {

struct ProcessLabelsHolder {
  absl::Mutex mu;
  prometheus::Labels labels ABSL_GUARDED_BY(mu);
};

ProcessLabelsHolder& Holder() {
  static ProcessLabelsHolder* holder = new ProcessLabelsHolder();
  return *holder;
}

// Never destroyed: a scrape may race the process's exit.
const std::shared_ptr<prometheus::Registry>& SharedRegistry() {
  static auto* registry =
      new std::shared_ptr<prometheus::Registry>(std::make_shared<prometheus::Registry>());
  return *registry;
}

}  // namespace

prometheus::Registry& GlobalRegistry() { return *SharedRegistry(); }

void SetProcessLabels(prometheus::Labels labels) {
  ProcessLabelsHolder& holder = Holder();
  absl::MutexLock lock(&holder.mu);
  holder.labels = std::move(labels);
}

prometheus::Labels ProcessLabels() {
  ProcessLabelsHolder& holder = Holder();
  absl::MutexLock lock(&holder.mu);
  return holder.labels;
}

prometheus::Family<prometheus::Counter>& CounterFamily(const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(ProcessLabels()).Register(
      GlobalRegistry());
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(ProcessLabels()).Register(
      GlobalRegistry());
}

prometheus::Family<prometheus::Histogram>& HistogramFamily(const std::string& name,
                                                           const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Labels(ProcessLabels()).Register(
      GlobalRegistry());
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10, 30};
}

std::vector<double> StalenessBuckets() {
  return {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

void Exposition::Add(std::shared_ptr<const prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

std::string Exposition::Render() const {
  std::vector<std::shared_ptr<const prometheus::Collectable>> collectables;
  {
    absl::MutexLock lock(&mu_);
    collectables = collectables_;
  }
  std::vector<prometheus::MetricFamily> families;
  for (const auto& collectable : collectables) {
    std::vector<prometheus::MetricFamily> collected = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(collected.begin()),
                    std::make_move_iterator(collected.end()));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

Exposition& GlobalExposition() {
  static Exposition* exposition = [] {
    auto* e = new Exposition();  // never destroyed, as the registry
    e->Add(SharedRegistry());
    return e;
  }();
  return *exposition;
}

}  // namespace pst::metrics
