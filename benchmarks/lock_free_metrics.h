// The alternative metrics_bench measures prometheus-cpp against: labelled
// counters and histograms recorded with relaxed atomics only (prometheus-cpp's
// Histogram::Observe takes a mutex), rendered in the text exposition format.
// It is what pstrain would keep in place of prometheus-cpp if the step path
// needed it; docs/architecture.md says why it does not.
#ifndef PST_BENCHMARKS_LOCK_FREE_METRICS_H_
#define PST_BENCHMARKS_LOCK_FREE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pst::metrics::lock_free {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void Increment(double by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds; a +Inf bucket is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // not cumulative; +Inf last
  std::atomic<double> sum_{0.0};
};

// A family of series told apart by their labels; every series carries the
// family's constant labels first. Series are never removed.
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, Labels constant)
      : name_(std::move(name)), help_(std::move(help)), constant_(std::move(constant)) {}

  template <typename... Args>
  T& Add(const Labels& labels, Args&&... args) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<T>& series = series_[labels];
    if (series == nullptr) series = std::make_unique<T>(std::forward<Args>(args)...);
    return *series;
  }

  void Render(std::string* out) const;

 private:
  const std::string name_;
  const std::string help_;
  const Labels constant_;
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              const Labels& constant);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  const Labels& constant);
  std::string Render() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pst::metrics::lock_free

#endif  // PST_BENCHMARKS_LOCK_FREE_METRICS_H_
