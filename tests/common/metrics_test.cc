// The metrics registry's text format, and the HTTP endpoint scraped over a
// raw loopback socket the way Prometheus does.
#include "common/metrics.h"

#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics_http.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/http.h"

namespace pst::metrics {
namespace {

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

TEST(FormatValueTest, WritesNumbersAsPrometheusReadsThem) {
  struct Case {
    double value;
    const char* text;
  };
  for (const Case& c : {Case{0, "0"}, Case{1, "1"}, Case{0.25, "0.25"}, Case{1e-4, "0.0001"},
                        Case{123456789, "123456789"}, Case{1e20, "1e+20"},
                        Case{-2.5e-9, "-2.5e-09"}, Case{INFINITY, "+Inf"},
                        Case{-INFINITY, "-Inf"}, Case{NAN, "NaN"}}) {
    EXPECT_EQ(FormatValue(c.value), c.text);
  }
}

TEST(RegistryTest, CounterAndGaugeHaveHelpTypeAndValue) {
  Registry registry;
  registry.AddCounter("pst_test_events_total", "Events seen.").Increment(3);
  registry.AddGauge("pst_test_level", "A level.").Set(2.5);
  EXPECT_EQ(registry.Render(),
            "# HELP pst_test_events_total Events seen.\n"
            "# TYPE pst_test_events_total counter\n"
            "pst_test_events_total 3\n"
            "# HELP pst_test_level A level.\n"
            "# TYPE pst_test_level gauge\n"
            "pst_test_level 2.5\n");
}

TEST(RegistryTest, RegisteringANameAgainReturnsTheSameInstrument) {
  Registry registry;
  Counter& first = registry.AddCounter("pst_test_total", "help");
  Counter& second = registry.AddCounter("pst_test_total", "help");
  EXPECT_EQ(&first, &second);
  first.Increment();
  second.Increment();
  EXPECT_EQ(ParseSamples(registry.Render())["pst_test_total"], 2);
}

TEST(RegistryTest, HistogramBucketsAreCumulativeWithSumAndCount) {
  Registry registry;
  Histogram& h = registry.AddHistogram("pst_test_seconds", "Latency.", {0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 20.0}) h.Observe(v);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# TYPE pst_test_seconds histogram\n"));
  std::map<std::string, double> s = ParseSamples(text);
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"0.1\"}"], 2);  // le: 0.1 itself counts
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"1\"}"], 3);
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"10\"}"], 4);
  EXPECT_EQ(s["pst_test_seconds_bucket{le=\"+Inf\"}"], 5);
  EXPECT_EQ(s["pst_test_seconds_count"], 5);
  EXPECT_DOUBLE_EQ(s["pst_test_seconds_sum"], 22.65);
}

TEST(RegistryTest, CallbacksAreReadAtScrapeTime) {
  Registry registry;
  double source = 1;
  registry.AddCallback("pst_test_version", "Version.", Type::kGauge, [&] { return source; });
  registry.AddCallback("pst_test_done_total", "Done.", Type::kCounter, [&] { return 7.0; });
  EXPECT_EQ(ParseSamples(registry.Render())["pst_test_version"], 1);
  source = 42;
  const std::string text = registry.Render();
  EXPECT_EQ(ParseSamples(text)["pst_test_version"], 42);
  EXPECT_THAT(text, HasSubstr("# TYPE pst_test_done_total counter\n"));
}

// A collector's metrics come from one reading per scrape, in its order.
TEST(RegistryTest, ACollectorIsReadOncePerScrapeForAllItsMetrics) {
  Registry registry;
  int reads = 0;
  registry.AddCollector({{"pst_test_applied_total", "Applied.", Type::kCounter},
                         {"pst_test_level", "Level.", Type::kGauge}},
                        [&] {
                          ++reads;
                          return std::vector<double>{10.0 * reads, 0.5 * reads};
                        });
  std::string text = registry.Render();
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(text,
            "# HELP pst_test_applied_total Applied.\n"
            "# TYPE pst_test_applied_total counter\n"
            "pst_test_applied_total 10\n"
            "# HELP pst_test_level Level.\n"
            "# TYPE pst_test_level gauge\n"
            "pst_test_level 0.5\n");
  std::map<std::string, double> samples = ParseSamples(registry.Render());
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(samples["pst_test_applied_total"], 20);
  EXPECT_EQ(samples["pst_test_level"], 1);
  // Registered again: the new reading replaces the old, in place.
  registry.AddCollector({{"pst_test_level", "Level.", Type::kGauge}},
                        [] { return std::vector<double>{7}; });
  samples = ParseSamples(registry.Render());
  EXPECT_EQ(reads, 3);  // still read for the metric it keeps
  EXPECT_EQ(samples["pst_test_level"], 7);
}

TEST(RegistryTest, ConcurrentObservationsAreAllCounted) {
  Registry registry;
  Histogram& h = registry.AddHistogram("pst_test_h", "h", LatencyBuckets());
  Counter& c = registry.AddCounter("pst_test_c_total", "c");
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
  EXPECT_EQ(h.Read().count, 40000u);
  EXPECT_EQ(c.value(), 40000u);
  EXPECT_NEAR(h.Read().sum, 40.0, 1e-6);
}

TEST(MetricsServerTest, ServesMetricsOnLoopbackAnd404Elsewhere) {
  Registry registry;
  registry.AddCounter("pst_test_scrapes_total", "Scrapes.").Increment(5);
  registry.AddHistogram("pst_test_latency_seconds", "Latency.", LatencyBuckets()).Observe(0.003);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(&registry, "127.0.0.1", 0);
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
  Registry registry;
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

}  // namespace
}  // namespace pst::metrics
