// The process's metrics (prometheus-cpp families with the process's labels)
// in the text format, and the HTTP endpoint scraped over a raw loopback
// socket the way Prometheus does.
#include "common/metrics.h"

#include <cmath>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics_http.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/http.h"

namespace pst::metrics {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sample name (labels included) -> value, from exposition text; fails the
// test on a line that is neither a comment nor "name value".
std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    EXPECT_EQ(parts.size(), 2u) << line;
    if (parts.size() != 2) continue;
    double value = 0;
    if (parts[1] == "+Inf") {
      value = INFINITY;
    } else {
      EXPECT_TRUE(absl::SimpleAtod(parts[1], &value)) << line;
    }
    samples[std::string(parts[0])] = value;
  }
  return samples;
}

// Families registered through the builders carry the process's labels;
// a series adds its own.
TEST(MetricsTest, FamiliesCarryTheProcessLabelsAndSeriesTheirOwn) {
  SetProcessLabels({{"task", "worker:3"}, {"worker", "3"}});
  CounterFamily("pst_test_events_total", "Events seen.").Add({}).Increment(3);
  GaugeFamily("pst_test_level", "A level.").Add({{"shard", "1"}}).Set(2.5);
  HistogramFamily("pst_test_seconds", "Latency.").Add({}, std::vector<double>{0.1, 1, 10});
  const std::string text = GlobalExposition().Render();
  EXPECT_THAT(text, HasSubstr("# HELP pst_test_events_total Events seen.\n"
                              "# TYPE pst_test_events_total counter\n"
                              "pst_test_events_total{task=\"worker:3\",worker=\"3\"} 3\n"));
  std::map<std::string, double> s = ParseSamples(text);
  EXPECT_EQ(s["pst_test_level{task=\"worker:3\",worker=\"3\",shard=\"1\"}"], 2.5) << text;
  EXPECT_EQ(s.count("pst_test_seconds_bucket{task=\"worker:3\",worker=\"3\",le=\"+Inf\"}"), 1u);
  EXPECT_EQ(ProcessLabels().at("task"), "worker:3");
}

TEST(MetricsTest, RegisteringANameAgainReturnsTheSameFamily) {
  prometheus::Family<prometheus::Counter>& first = CounterFamily("pst_test_again_total", "help");
  prometheus::Family<prometheus::Counter>& second = CounterFamily("pst_test_again_total", "help");
  EXPECT_EQ(&first, &second);
  first.Add({}).Increment();
  second.Add({}).Increment();
  EXPECT_EQ(first.Add({}).Value(), 2);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithSumAndCount) {
  Exposition exposition;
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Histogram& h = prometheus::BuildHistogram()
                                 .Name("pst_test_seconds")
                                 .Help("Latency.")
                                 .Register(*registry)
                                 .Add({}, std::vector<double>{0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0}) h.Observe(v);
  exposition.Add(registry);
  const std::string text = exposition.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE pst_test_seconds histogram\n"));
  std::map<std::string, double> s = ParseSamples(text);
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"0.1\"}"], 2);  // le: 0.1 itself counts
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"1\"}"], 3);
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"10\"}"], 4);
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"+Inf\"}"], 5);
  EXPECT_EQ(s["pst_test_seconds_count"], 5);
  EXPECT_DOUBLE_EQ(s["pst_test_seconds_sum"], 22.65);
}

// A hot path indexes the series of a label it knows by number.
TEST(SeriesByIndexTest, AddsEachIndexOnceWithItsLabel) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Histogram>& family =
      prometheus::BuildHistogram().Name("pst_test_staleness").Help("h").Register(*registry);
  SeriesByIndex<prometheus::Histogram, std::vector<double>> by_shard(&family, "shard",
                                                                     StalenessBuckets());
  by_shard[2].Observe(1);
  by_shard[0].Observe(0);
  by_shard[2].Observe(3);
  EXPECT_EQ(&by_shard[2], &family.Add({{"shard", "2"}}, StalenessBuckets()));
  Exposition exposition;
  exposition.Add(registry);
  std::map<std::string, double> s = ParseSamples(exposition.Render());
  EXPECT_EQ(s["pst_test_staleness_count{shard=\"2\"}"], 2);
  EXPECT_EQ(s["pst_test_staleness_count{shard=\"0\"}"], 1);
  EXPECT_EQ(s.count("pst_test_staleness_count{shard=\"1\"}"), 0u);  // never asked for
}

// What an exposition renders: each collectable collected on every render,
// in the order they were added.
TEST(ExpositionTest, CollectsEveryCollectableOnEachRender) {
  struct Counting : prometheus::Collectable {
    mutable int reads = 0;
    std::vector<prometheus::MetricFamily> Collect() const override {
      ++reads;
      prometheus::MetricFamily family{"pst_test_reads", "Reads.", prometheus::MetricType::Gauge,
                                      {}};
      family.metric.emplace_back();
      family.metric.back().gauge.value = reads;
      return {family};
    }
  };
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("pst_test_first_total").Help("f").Register(*registry).Add({});
  auto counting = std::make_shared<Counting>();
  Exposition exposition;
  exposition.Add(registry);
  exposition.Add(counting);
  std::string text = exposition.Render();
  EXPECT_LT(text.find("pst_test_first_total"), text.find("pst_test_reads"));
  EXPECT_EQ(ParseSamples(text)["pst_test_reads"], 1);
  EXPECT_EQ(ParseSamples(exposition.Render())["pst_test_reads"], 2);
}

TEST(MetricsTest, ConcurrentObservationsAreAllCounted) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Histogram& h = prometheus::BuildHistogram().Name("pst_test_h").Help("h").Register(
      *registry).Add({}, LatencyBuckets());
  prometheus::Counter& c =
      prometheus::BuildCounter().Name("pst_test_c_total").Help("c").Register(*registry).Add({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        h.Observe(0.001);
        c.Increment();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Exposition exposition;
  exposition.Add(registry);
  std::map<std::string, double> s = ParseSamples(exposition.Render());
  EXPECT_EQ(s["pst_test_h_count"], 40000);
  EXPECT_EQ(s["pst_test_c_total"], 40000);
  EXPECT_NEAR(s["pst_test_h_sum"], 40.0, 1e-6);
}

TEST(MetricsServerTest, ServesMetricsOnLoopbackAnd404Elsewhere) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("pst_test_scrapes_total").Help("Scrapes.").Register(*registry)
      .Add({}).Increment(5);
  prometheus::BuildHistogram().Name("pst_test_latency_seconds").Help("Latency.").Register(*registry)
      .Add({}, LatencyBuckets()).Observe(0.003);
  Exposition exposition;
  exposition.Add(registry);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&exposition, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  HttpReply ok = HttpRequest((*server)->port(), "GET", "/metrics");
  EXPECT_EQ(ok.status, 200) << ok.headers;
  EXPECT_THAT(ok.headers, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(ok.body, StartsWith("# HELP pst_test_scrapes_total Scrapes.\n"));
  std::map<std::string, double> samples = ParseSamples(ok.body);
  EXPECT_EQ(samples["pst_test_scrapes_total"], 5);
  EXPECT_EQ(samples["pst_test_latency_seconds_count"], 1);
  EXPECT_EQ(samples["pst_test_latency_seconds_bucket{le=\"0.0025\"}"], 0);
  EXPECT_EQ(samples["pst_test_latency_seconds_bucket{le=\"0.005\"}"], 1);

  EXPECT_EQ(HttpRequest((*server)->port(), "GET", "/").status, 404);
  EXPECT_EQ(HttpRequest((*server)->port(), "GET", "/metrics/x").status, 404);
  EXPECT_EQ(HttpRequest((*server)->port(), "POST", "/metrics").status, 405);
}

TEST(MetricsServerTest, BadAddressAndBusyPortAreErrorsNotCrashes) {
  Exposition registry;
  absl::StatusOr<std::unique_ptr<MetricsServer>> bad =
      MetricsServer::Start(&registry, "localhost:1", 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("not an IP address"));

  absl::StatusOr<std::unique_ptr<MetricsServer>> first =
      MetricsServer::Start(&registry, "127.0.0.1", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(&registry, "127.0.0.1", (*first)->port());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("in use"));
}

// The endpoint is plain HTTP without the cluster's token: beyond loopback,
// in a cluster that secures its RPCs, that is worth a warning.
TEST(ExposureWarningTest, WarnsOnlyForAReachableEndpointOfASecureCluster) {
  struct Case {
    std::string address;
    int port;
    bool tls;
    bool warned;
  };
  const std::vector<Case> cases = {
      {"0.0.0.0", 9100, true, true},   {"10.1.2.3", 9100, true, true},
      {"::", 9100, true, true},        {"127.0.0.1", 9100, true, false},
      {"::1", 9100, true, false},      {"0.0.0.0", 9100, false, false},
      {"0.0.0.0", 0, true, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.address, ":", c.port, c.tls ? " TLS" : " plaintext"));
    std::optional<std::string> warning = ExposureWarning(c.address, c.port, c.tls);
    EXPECT_EQ(warning.has_value(), c.warned);
    if (warning) {
      EXPECT_THAT(*warning, ::testing::HasSubstr("--metrics_address"));
    }
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst::metrics
