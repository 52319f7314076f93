// metrics_bench: what the metrics cost on the hot path. Times
// Histogram::Observe and Counter::Increment from 1 and 2 threads (the PS
// serves Pulls and Pushes on several threads at once), and one Render of a
// registry shaped like the PS's. Where prometheus-cpp was found at build
// time, the same operations of prometheus-cpp run in the same invocation,
// as the peer (PST_HAVE_PROMETHEUS_CPP). Prints ns per operation, medians
// of --runs, as a table or, with --json, one JSON object per row.
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "common/metrics.h"

#if PST_HAVE_PROMETHEUS_CPP
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#endif

ABSL_FLAG(int, ops, 2'000'000, "Operations per thread per run.");
ABSL_FLAG(int, runs, 5, "Runs per measurement; the median is printed.");
ABSL_FLAG(bool, json, false, "Print one JSON object per row instead of a table.");

namespace pst::metrics {
namespace {

template <typename Op>
double NanosPerOp(int threads, Op op) {
  const int ops = absl::GetFlag(FLAGS_ops);
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
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("{\"operation\":\"%s\",\"threads\":%d,\"%s_per_op\":%.1f}\n", operation.c_str(),
                threads, unit, value);
  } else {
    std::printf("%-50s %8d %12.1f %s\n", operation.c_str(), threads, value, unit);
  }
  std::fflush(stdout);
}

// A scrape renders every instrument once; the median of 101 renders.
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

#if PST_HAVE_PROMETHEUS_CPP
// prometheus-cpp doing what Main times of ours, on a registry of the same shape.
void PrometheusCppRows() {
  prometheus::Registry registry;
  const std::vector<double> bounds = LatencyBuckets();
  prometheus::Histogram& latency =
      prometheus::BuildHistogram().Name("bench_seconds").Help("b").Register(registry).Add(
          {}, bounds);
  prometheus::Counter& counter =
      prometheus::BuildCounter().Name("bench_total").Help("b").Register(registry).Add({});
  for (int i = 0; i < 10; ++i) {
    prometheus::BuildHistogram()
        .Name("bench_extra_" + std::to_string(i))
        .Help("b")
        .Register(registry)
        .Add({}, bounds);
  }
  const std::string observe =
      "prometheus-cpp Histogram::Observe (" + std::to_string(bounds.size()) + " buckets)";
  for (int threads : {1, 2}) {
    PrintRow(observe, threads,
             NanosPerOp(threads, [&](int t, int i) { latency.Observe(1e-4 * (i % 1000)); }), "ns");
    PrintRow("prometheus-cpp Counter::Increment", threads,
             NanosPerOp(threads, [&](int, int) { counter.Increment(); }), "ns");
  }
  prometheus::TextSerializer serializer;
  PrintRow("prometheus-cpp Collect+Serialize (12 histograms)", 1,
           MedianRenderMicros([&] { return serializer.Serialize(registry.Collect()); }), "us");
}
#endif

int Main() {
  Registry registry;
  Histogram& latency = registry.AddHistogram("bench_seconds", "b", LatencyBuckets());
  Counter& counter = registry.AddCounter("bench_total", "b");
  for (int i = 0; i < 10; ++i) {
    registry.AddHistogram("bench_extra_" + std::to_string(i), "b", LatencyBuckets());
  }
  const std::string observe =
      "Histogram::Observe (" + std::to_string(LatencyBuckets().size()) + " buckets)";
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("%-50s %8s %12s\n", "operation", "threads", "time/op");
  }
  for (int threads : {1, 2}) {
    PrintRow(observe, threads,
             NanosPerOp(threads, [&](int t, int i) { latency.Observe(1e-4 * (i % 1000)); }), "ns");
    PrintRow("Counter::Increment", threads,
             NanosPerOp(threads, [&](int, int) { counter.Increment(); }), "ns");
  }
  PrintRow("Registry::Render (12 histograms)", 1,
           MedianRenderMicros([&] { return registry.Render(); }), "us");
#if PST_HAVE_PROMETHEUS_CPP
  PrometheusCppRows();
#endif
  return 0;
}

}  // namespace
}  // namespace pst::metrics

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times the metrics instruments. Usage: metrics_bench [--ops=N] [--runs=N] [--json]");
  absl::ParseCommandLine(argc, argv);
  return pst::metrics::Main();
}
