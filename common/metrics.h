// The process's Prometheus metrics, kept in prometheus-cpp (Debian's
// prometheus-cpp-dev): counters, gauges and histograms in labelled families.
//
// Every metric a process registers through the builders below carries the
// labels that name the process (SetProcessLabels: task="ps:0" shard="0", or
// task="worker:1" worker="1"); a series adds the peer or the variable it is
// about (shard="2" on a worker's per-shard series, worker="1" on a shard's
// per-worker series, variable="dense/w" on a per-variable one). Label values
// are bounded by the cluster and the model: tasks, shards, workers and
// top-level variables, never rows or calls.
//
//   prometheus::Histogram& step = HistogramFamily("pst_worker_step_seconds", "...")
//                                     .Add({}, LatencyBuckets());
//   step.Observe(0.012);      // the hot path: the series is looked up once
//   std::string text = GlobalExposition().Render();
//
// Names follow Prometheus conventions: pst_<process>_<what>[_<unit>][_total].
// Registering a name again returns the family already registered under it.
#ifndef PST_COMMON_METRICS_H_
#define PST_COMMON_METRICS_H_

#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/registry.h"

namespace pst::metrics {

// The registry of this process, which the metrics endpoint serves.
prometheus::Registry& GlobalRegistry();

// The labels naming this process, added to every family the builders below
// register from then on: set them once, before the first metric registers
// (ps_server and worker do, from --task). Empty until set.
void SetProcessLabels(prometheus::Labels labels);
prometheus::Labels ProcessLabels();

// Families on GlobalRegistry() carrying ProcessLabels() (see the top).
prometheus::Family<prometheus::Counter>& CounterFamily(const std::string& name,
                                                       const std::string& help);
prometheus::Family<prometheus::Gauge>& GaugeFamily(const std::string& name,
                                                   const std::string& help);
prometheus::Family<prometheus::Histogram>& HistogramFamily(const std::string& name,
                                                           const std::string& help);

// Bucket bounds for RPC and step latencies in seconds: 100 us to 30 s.
std::vector<double> LatencyBuckets();
// Bucket bounds for staleness in versions: 0, 1, 2, 4, ... 1024.
std::vector<double> StalenessBuckets();

// A family's series for each value of one label (a shard's index), added on
// first use and kept, so that a hot path indexes a vector instead of
// hashing labels. `Args` are what Family::Add takes after the labels (a
// histogram's bucket bounds). The family must outlive this.
template <typename T, typename... Args>
class SeriesByIndex {
 public:
  SeriesByIndex(prometheus::Family<T>* family, std::string label, Args... args)
      : family_(family), label_(std::move(label)), args_(std::move(args)...) {}

  T& operator[](int index) {
    absl::MutexLock lock(&mu_);
    if (index >= static_cast<int>(series_.size())) series_.resize(index + 1, nullptr);
    if (series_[index] == nullptr) {
      series_[index] = std::apply(
          [&](const Args&... args) -> T* {
            return &family_->Add({{label_, std::to_string(index)}}, args...);
          },
          args_);
    }
    return *series_[index];
  }

 private:
  prometheus::Family<T>* const family_;
  const std::string label_;
  const std::tuple<Args...> args_;
  absl::Mutex mu_;
  std::vector<T*> series_ ABSL_GUARDED_BY(mu_);
};

// What a metrics endpoint serves: GlobalRegistry(), then every collectable
// added (a shard's Stats, read once per scrape), in the text exposition
// format (version 0.0.4).
class Exposition {
 public:
  // `collectable` is kept, and collected on every Render from then on.
  void Add(std::shared_ptr<const prometheus::Collectable> collectable);
  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<const prometheus::Collectable>> collectables_ ABSL_GUARDED_BY(mu_);
};

// The exposition of this process, GlobalRegistry() first.
Exposition& GlobalExposition();

}  // namespace pst::metrics

#endif  // PST_COMMON_METRICS_H_
