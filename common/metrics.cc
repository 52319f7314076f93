#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"

namespace pst::metrics {

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

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    snapshot.cumulative.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10, 30};
}

std::vector<double> StalenessBuckets() {
  return {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[400];
  // Plain decimals where they are short (0.0001, not 1e-04), as other
  // exporters write bucket bounds; the shortest round-trip form elsewhere.
  const double magnitude = std::fabs(value);
  const bool plain = magnitude == 0 || (magnitude >= 1e-6 && magnitude < 1e15);
  auto [end, error] = plain ? std::to_chars(buffer, buffer + sizeof(buffer), value,
                                            std::chars_format::fixed)
                            : std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end);
}

struct Registry::Family {
  std::string name;
  std::string help;
  // Exactly one of these is set (a collector with its index).
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::function<double()> callback;
  std::shared_ptr<const std::function<std::vector<double>()>> collector;
  size_t collected = 0;
  Type callback_type = Type::kGauge;

  const char* TypeName() const {
    if (counter) return "counter";
    if (gauge) return "gauge";
    if (histogram) return "histogram";
    return callback_type == Type::kCounter ? "counter" : "gauge";
  }
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family* Registry::Find(const std::string& name) {
  for (const auto& family : families_) {
    if (family->name == name) return family.get();
  }
  return nullptr;
}

Counter& Registry::AddCounter(const std::string& name, const std::string& help) {
  absl::MutexLock lock(&mu_);
  Family* family = Find(name);
  if (family == nullptr || !family->counter) {
    families_.push_back(std::make_unique<Family>());
    family = families_.back().get();
    family->name = name;
    family->help = help;
    family->counter = std::make_unique<Counter>();
  }
  return *family->counter;
}

Gauge& Registry::AddGauge(const std::string& name, const std::string& help) {
  absl::MutexLock lock(&mu_);
  Family* family = Find(name);
  if (family == nullptr || !family->gauge) {
    families_.push_back(std::make_unique<Family>());
    family = families_.back().get();
    family->name = name;
    family->help = help;
    family->gauge = std::make_unique<Gauge>();
  }
  return *family->gauge;
}

Histogram& Registry::AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> bounds) {
  absl::MutexLock lock(&mu_);
  Family* family = Find(name);
  if (family == nullptr || !family->histogram) {
    families_.push_back(std::make_unique<Family>());
    family = families_.back().get();
    family->name = name;
    family->help = help;
    family->histogram = std::make_unique<Histogram>(std::move(bounds));
  }
  return *family->histogram;
}

void Registry::AddCallback(const std::string& name, const std::string& help, Type type,
                           std::function<double()> read) {
  absl::MutexLock lock(&mu_);
  Family* family = Find(name);
  if (family == nullptr) {
    families_.push_back(std::make_unique<Family>());
    family = families_.back().get();
    family->name = name;
  }
  family->help = help;
  family->callback = std::move(read);
  family->collector.reset();
  family->callback_type = type;
}

void Registry::AddCollector(const std::vector<Collected>& metrics,
                            std::function<std::vector<double>()> read) {
  auto collector = std::make_shared<const std::function<std::vector<double>()>>(std::move(read));
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < metrics.size(); ++i) {
    Family* family = Find(metrics[i].name);
    if (family == nullptr) {
      families_.push_back(std::make_unique<Family>());
      family = families_.back().get();
      family->name = metrics[i].name;
    }
    family->help = metrics[i].help;
    family->callback = nullptr;
    family->collector = collector;
    family->collected = i;
    family->callback_type = metrics[i].type;
  }
}

namespace {

// HELP text escapes backslash and newline.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void RenderHistogram(const std::string& name, const Histogram& histogram, std::string* out) {
  Histogram::Snapshot s = histogram.Read();
  for (size_t i = 0; i < s.bounds.size(); ++i) {
    absl::StrAppend(out, name, "_bucket{le=\"", FormatValue(s.bounds[i]), "\"} ",
                    s.cumulative[i], "\n");
  }
  absl::StrAppend(out, name, "_bucket{le=\"+Inf\"} ", s.count, "\n");
  absl::StrAppend(out, name, "_sum ", FormatValue(s.sum), "\n");
  absl::StrAppend(out, name, "_count ", s.count, "\n");
}

}  // namespace

std::string Registry::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  // Each collector's reading, taken at its first metric.
  std::map<const void*, std::vector<double>> readings;
  for (const auto& family : families_) {
    absl::StrAppend(&out, "# HELP ", family->name, " ", EscapeHelp(family->help), "\n");
    absl::StrAppend(&out, "# TYPE ", family->name, " ", family->TypeName(), "\n");
    if (family->counter) {
      absl::StrAppend(&out, family->name, " ", family->counter->value(), "\n");
    } else if (family->gauge) {
      absl::StrAppend(&out, family->name, " ", FormatValue(family->gauge->value()), "\n");
    } else if (family->histogram) {
      RenderHistogram(family->name, *family->histogram, &out);
    } else if (family->collector) {
      auto [reading, first] = readings.try_emplace(family->collector.get());
      if (first) reading->second = (*family->collector)();
      const std::vector<double>& values = reading->second;
      const double value = family->collected < values.size() ? values[family->collected] : NAN;
      absl::StrAppend(&out, family->name, " ", FormatValue(value), "\n");
    } else {
      absl::StrAppend(&out, family->name, " ", FormatValue(family->callback()), "\n");
    }
  }
  return out;
}

Registry& GlobalRegistry() {
  static Registry* registry = new Registry();  // never destroyed: scrapes may race exit
  return *registry;
}

}  // namespace pst::metrics
