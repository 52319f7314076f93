#include "benchmarks/lock_free_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pst::metrics::lock_free {
namespace {

// `{a="1",b="2"` (open: a histogram's bucket appends le) from the constant
// labels, then the series' own.
std::string OpenLabels(const Labels& constant, const Labels& labels) {
  std::string text = "{";
  for (const Labels* set : {&constant, &labels}) {
    for (const auto& [name, value] : *set) {
      absl::StrAppend(&text, text.size() > 1 ? "," : "", name, "=\"", value, "\"");
    }
  }
  return text;
}

void Header(const std::string& name, const std::string& help, const char* type,
            std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // Prometheus buckets are "less than or equal": the first bound >= value.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels,
                       std::string* out) const {
  const std::string bucket_labels = labels.size() > 1 ? labels + "," : labels;
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    absl::StrAppend(out, name, "_bucket", bucket_labels, "le=\"", bounds_[i], "\"} ", running,
                    "\n");
  }
  running += buckets_[bounds_.size()].load(std::memory_order_relaxed);
  absl::StrAppend(out, name, "_bucket", bucket_labels, "le=\"+Inf\"} ", running, "\n");
  absl::StrAppend(out, name, "_sum", labels, "} ", sum_.load(std::memory_order_relaxed), "\n");
  absl::StrAppend(out, name, "_count", labels, "} ", running, "\n");
}

template <>
void Family<Counter>::Render(std::string* out) const {
  absl::MutexLock lock(&mu_);
  Header(name_, help_, "counter", out);
  for (const auto& [labels, series] : series_) {
    absl::StrAppend(out, name_, OpenLabels(constant_, labels), "} ", series->value(), "\n");
  }
}

template <>
void Family<Histogram>::Render(std::string* out) const {
  absl::MutexLock lock(&mu_);
  Header(name_, help_, "histogram", out);
  for (const auto& [labels, series] : series_) {
    series->Render(name_, OpenLabels(constant_, labels), out);
  }
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      const Labels& constant) {
  absl::MutexLock lock(&mu_);
  counters_.push_back(std::make_unique<Family<Counter>>(name, help, constant));
  return *counters_.back();
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          const Labels& constant) {
  absl::MutexLock lock(&mu_);
  histograms_.push_back(std::make_unique<Family<Histogram>>(name, help, constant));
  return *histograms_.back();
}

std::string Registry::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& family : counters_) family->Render(&out);
  for (const auto& family : histograms_) family->Render(&out);
  return out;
}

}  // namespace pst::metrics::lock_free
