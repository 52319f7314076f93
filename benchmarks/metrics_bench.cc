// metrics_bench: what the metrics cost on the hot path, labelled as
// ps_server and worker label them, for the registry pstrain uses
// (prometheus-cpp, --registry=prometheus-cpp) and for the lock-free
// alternative (--registry=lock-free, benchmarks/lock_free_metrics.h). Times
// Histogram::Observe and Counter::Increment on a labelled series from 1 and
// 2 threads (the PS serves Pulls and Pushes on several threads at once);
// one worker step's recording with 4 shards (what Trainer records per step:
// two latencies, the step count and samples, and per shard its version,
// staleness and drops); and one scrape of a registry shaped like a worker's
// (12 histograms with 4 shard series each). Prints ns or us per operation,
// medians of --runs, as a table or, with --json, one JSON object per row.
// benchmarks/rounds.py --vary=registry=... alternates the two.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "benchmarks/lock_free_metrics.h"
#include "common/metrics.h"
#include "prometheus/text_serializer.h"

ABSL_FLAG(std::string, registry, "prometheus-cpp",
          "prometheus-cpp (what ps_server and worker use) or lock-free (the alternative).");
ABSL_FLAG(int, ops, 2'000'000,
          "Operations per thread per run (a tenth of them for the worker step's recording).");
ABSL_FLAG(int, runs, 5, "Runs per measurement; the median is printed.");
ABSL_FLAG(bool, json, false, "Print one JSON object per row instead of a table.");

namespace pst::metrics {
namespace {

constexpr int kShards = 4;
constexpr int kRenderedHistograms = 12;

// `ops_divisor` shortens a measurement whose operation is long.
template <typename Op>
double NanosPerOp(int threads, Op op, int ops_divisor = 1) {
  const int ops = std::max(1, absl::GetFlag(FLAGS_ops) / ops_divisor);
  std::vector<double> runs;
  for (int r = 0; r < absl::GetFlag(FLAGS_runs); ++r) {
    absl::Time start = absl::Now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (int i = 0; i < ops; ++i) op(t, i);
      });
    }
    for (std::thread& w : workers) w.join();
    runs.push_back(absl::ToDoubleNanoseconds(absl::Now() - start) / ops);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// One row of the table, or of JSON with --json.
void PrintRow(const std::string& operation, int threads, double value, const char* unit) {
  const std::string registry = absl::GetFlag(FLAGS_registry);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"operation\":\"%s\",\"registry\":\"%s\",\"threads\":%d,\"%s_per_op\":%.1f}\n",
                operation.c_str(), registry.c_str(), threads, unit, value);
  } else {
    std::printf("%-16s %-40s %8d %12.1f %s\n", registry.c_str(), operation.c_str(), threads,
                value, unit);
  }
  std::fflush(stdout);
}

// A scrape renders every series once; the median of 101 renders.
template <typename Render>
double MedianRenderMicros(Render render) {
  std::vector<double> renders;
  for (int r = 0; r < 101; ++r) {
    absl::Time start = absl::Now();
    std::string text = render();
    renders.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  std::sort(renders.begin(), renders.end());
  return renders[50];
}

const std::map<std::string, std::string> kProcess = {{"task", "worker:0"}, {"worker", "0"}};

std::map<std::string, std::string> Shard(int shard) { return {{"shard", std::to_string(shard)}}; }

// The instruments one worker step records into.
template <typename Histogram, typename Counter, typename Gauge>
struct StepInstruments {
  Histogram* step;
  Histogram* exchange;
  Counter* steps;
  Counter* samples;
  std::vector<Histogram*> staleness;  // by shard
  std::vector<Counter*> dropped;
  std::vector<Gauge*> version;
};

// What a worker records per step (Trainer::RecordExchange, RecordStep):
// the step's figures, and each shard's, as the worker's SeriesByIndex hands
// them out (a lock, then an index).
template <typename Instruments>
void RecordStep(Instruments& m, absl::Mutex& series_lock, int i) {
  m.exchange->Observe(1e-4 * (i % 1000));
  for (int s = 0; s < kShards; ++s) {
    absl::MutexLock lock(&series_lock);
    m.version[s]->Set(i);
  }
  for (int s = 0; s < kShards; ++s) {
    absl::MutexLock lock(&series_lock);
    m.staleness[s]->Observe(i % 3);
    if (i % 1000 == 0) m.dropped[s]->Increment();
  }
  m.step->Observe(2e-4 * (i % 1000));
  m.steps->Increment();
  m.samples->Increment(32);
}

template <typename Histogram, typename Counter, typename Render>
void Rows(Histogram& latency, Counter& counter, Render render, auto& step) {
  absl::Mutex series_lock;
  for (int threads : {1, 2}) {
    PrintRow("Histogram::Observe (17 buckets)", threads,
             NanosPerOp(threads, [&](int, int i) { latency.Observe(1e-4 * (i % 1000)); }), "ns");
    PrintRow("Counter::Increment", threads,
             NanosPerOp(threads, [&](int, int) { counter.Increment(); }), "ns");
  }
  PrintRow("one worker step's recording (4 shards)", 1,
           NanosPerOp(1, [&](int, int i) { RecordStep(step, series_lock, i); }, 10), "ns");
  PrintRow("scrape (12 histograms x 4 shards)", 1, MedianRenderMicros(render), "us");
}

void PrometheusCpp() {
  prometheus::Registry registry;
  const std::vector<double> bounds = LatencyBuckets();
  auto histograms = [&](const std::string& name) -> prometheus::Family<prometheus::Histogram>& {
    return prometheus::BuildHistogram().Name(name).Help("b").Labels(kProcess).Register(registry);
  };
  auto counters = [&](const std::string& name) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help("b").Labels(kProcess).Register(registry);
  };
  auto& gauges =
      prometheus::BuildGauge().Name("bench_version").Help("b").Labels(kProcess).Register(registry);
  StepInstruments<prometheus::Histogram, prometheus::Counter, prometheus::Gauge> step{
      &histograms("bench_step_seconds").Add({}, bounds),
      &histograms("bench_exchange_seconds").Add({}, bounds),
      &counters("bench_steps_total").Add({}),
      &counters("bench_samples_total").Add({}),
      {}, {}, {}};
  for (int s = 0; s < kShards; ++s) {
    step.staleness.push_back(&histograms("bench_staleness").Add(Shard(s), StalenessBuckets()));
    step.dropped.push_back(&counters("bench_dropped_total").Add(Shard(s)));
    step.version.push_back(&gauges.Add(Shard(s)));
  }
  for (int h = 0; h < kRenderedHistograms; ++h) {
    for (int s = 0; s < kShards; ++s) {
      histograms("bench_extra_" + std::to_string(h) + "_seconds").Add(Shard(s), bounds);
    }
  }
  prometheus::Histogram& latency = histograms("bench_seconds").Add(Shard(0), bounds);
  prometheus::Counter& counter = counters("bench_total").Add(Shard(0));
  prometheus::TextSerializer serializer;
  Rows(latency, counter, [&] {
    std::ostringstream out;
    serializer.Serialize(out, registry.Collect());
    return out.str();
  }, step);
}

void LockFree() {
  namespace lf = lock_free;
  lf::Registry registry;
  const std::vector<double> bounds = LatencyBuckets();
  auto histograms = [&](const std::string& name) -> lf::Family<lf::Histogram>& {
    return registry.AddHistogram(name, "b", kProcess);
  };
  auto counters = [&](const std::string& name) -> lf::Family<lf::Counter>& {
    return registry.AddCounter(name, "b", kProcess);
  };
  // A gauge is a counter's atomic double, set instead of added to.
  struct Gauge {
    void Set(double value) { value_.store(value, std::memory_order_relaxed); }
    std::atomic<double> value_{0};
  };
  std::vector<std::unique_ptr<Gauge>> versions;
  StepInstruments<lf::Histogram, lf::Counter, Gauge> step{
      &histograms("bench_step_seconds").Add({}, bounds),
      &histograms("bench_exchange_seconds").Add({}, bounds),
      &counters("bench_steps_total").Add({}),
      &counters("bench_samples_total").Add({}),
      {}, {}, {}};
  lf::Family<lf::Histogram>& staleness = histograms("bench_staleness");
  lf::Family<lf::Counter>& dropped = counters("bench_dropped_total");
  for (int s = 0; s < kShards; ++s) {
    step.staleness.push_back(&staleness.Add(Shard(s), StalenessBuckets()));
    step.dropped.push_back(&dropped.Add(Shard(s)));
    versions.push_back(std::make_unique<Gauge>());
    step.version.push_back(versions.back().get());
  }
  for (int h = 0; h < kRenderedHistograms; ++h) {
    lf::Family<lf::Histogram>& extra = histograms("bench_extra_" + std::to_string(h) + "_seconds");
    for (int s = 0; s < kShards; ++s) extra.Add(Shard(s), bounds);
  }
  lf::Histogram& latency = histograms("bench_seconds").Add(Shard(0), bounds);
  lf::Counter& counter = counters("bench_total").Add(Shard(0));
  Rows(latency, counter, [&] { return registry.Render(); }, step);
}

int Main() {
  const std::string registry = absl::GetFlag(FLAGS_registry);
  if (registry != "prometheus-cpp" && registry != "lock-free") {
    std::fprintf(stderr, "metrics_bench: error: --registry=%s: use prometheus-cpp or lock-free\n",
                 registry.c_str());
    return 2;
  }
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%-16s %-40s %8s %12s\n", "registry", "operation", "threads", "time/op");
  }
  if (registry == "prometheus-cpp") {
    PrometheusCpp();
  } else {
    LockFree();
  }
  return 0;
}

}  // namespace
}  // namespace pst::metrics

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the metrics instruments, labelled. Usage: metrics_bench "
      "[--registry=prometheus-cpp|lock-free] [--ops=N] [--runs=N] [--json]");
  absl::ParseCommandLine(argc, argv);
  return pst::metrics::Main();
}
