// A small metrics registry rendered in the Prometheus text exposition format
// (version 0.0.4): counters, gauges and histograms with fixed buckets.
//
// Recording is lock-free (relaxed atomics), so instruments can sit on the
// hot path of every Pull and Push; only registration and Render() take the
// registry's lock. Metrics whose value already lives elsewhere (a shard's
// Stats) are registered as callbacks, or as a collector that reads them all
// at once, and read at scrape time instead of being counted twice.
//
//   Registry& registry = GlobalRegistry();
//   Histogram& latency = registry.AddHistogram("pst_ps_push_seconds", "...", LatencyBuckets());
//   latency.Observe(0.0012);
//   std::string text = registry.Render();
//
// Names follow Prometheus conventions: pst_<process>_<what>[_<unit>][_total].
// Registering a name again returns the instrument already registered under
// it, so independent components can share one.
#ifndef PST_COMMON_METRICS_H_
#define PST_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pst::metrics {

class Counter {
 public:
  void Increment(uint64_t by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, strictly increasing; a +Inf bucket
  // is implied.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (== count)
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

// Bucket bounds for RPC and step latencies in seconds: 100 us to 30 s.
std::vector<double> LatencyBuckets();
// Bucket bounds for staleness in versions: 0, 1, 2, 4, ... 1024.
std::vector<double> StalenessBuckets();

enum class Type { kCounter, kGauge };

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  Counter& AddCounter(const std::string& name, const std::string& help);
  Gauge& AddGauge(const std::string& name, const std::string& help);
  Histogram& AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds);
  // A counter or gauge whose value `read` returns at scrape time. `read`
  // must stay callable as long as anything may Render(); registering the
  // name again replaces the callback.
  void AddCallback(const std::string& name, const std::string& help, Type type,
                   std::function<double()> read);
  // Counters and gauges read together: `read` runs once per Render and
  // returns one value per entry of `metrics`, in that order, so that every
  // one of them comes from the same reading (one snapshot of a shard, taken
  // once per scrape). The same lifetime rule as AddCallback; registering a
  // name again replaces how it is read.
  struct Collected {
    std::string name;
    std::string help;
    Type type = Type::kGauge;
  };
  void AddCollector(const std::vector<Collected>& metrics,
                    std::function<std::vector<double>()> read);

  // Every metric, in registration order, with its # HELP and # TYPE lines.
  std::string Render() const;

 private:
  struct Family;
  Family* Find(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

// The registry of this process, which the metrics HTTP endpoint serves.
Registry& GlobalRegistry();

// A number as Prometheus writes it: shortest round-trip decimal, +Inf, -Inf, NaN.
std::string FormatValue(double value);

}  // namespace pst::metrics

#endif  // PST_COMMON_METRICS_H_
