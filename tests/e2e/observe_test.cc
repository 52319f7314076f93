// Observability of the shipped binaries on loopback: the metrics endpoints
// of a real ps_server and worker scraped over raw sockets while they train,
// and pslaunch's --metrics_port mapping, --logdir event file and --report
// page. Every process runs under `timeout` and is killed by its PID. The PS
// binds port 0 and reports the port it got.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"
#include "tests/support/http.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

bool PortIsFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool free = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return free;
}

// The first of `count` consecutive ports on 127.0.0.1 for metrics
// endpoints, which cannot be asked for port 0 (--metrics_port=0 turns them
// off), and pslaunch numbers them in a row. They are free now and lie below
// the kernel's ephemeral range (net.ipv4.ip_local_port_range), from which
// every port-0 bind and every connection's own port is taken, so no other
// test's servers or clients can take them meanwhile; the random start keeps
// two runs of this test apart.
int MetricsPorts(int count) {
  int ephemeral = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral;
  const int lowest = 10000, highest = std::max(lowest + 1, ephemeral - count);
  std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int first = std::uniform_int_distribution<int>(lowest, highest - 1)(random);
    bool all = true;
    for (int i = 0; all && i < count; ++i) all = PortIsFree(first + i);
    if (all) return first;
  }
  return 0;
}

// GET /metrics; empty unless it answers 200.
std::string Scrape(int port) {
  HttpReply reply = HttpRequest(port, "GET", "/metrics", /*timeout_seconds=*/5);
  return reply.status == 200 ? reply.body : "";
}

std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    double value = 0;
    if (parts.size() == 2 && absl::SimpleAtod(parts[1], &value)) {
      samples[std::string(parts[0])] = value;
    } else {
      ADD_FAILURE() << "not a sample line: " << line;
    }
  }
  return samples;
}

std::string WorkerSeries(const std::string& name) {
  return name + "{task=\"worker:0\",worker=\"0\"}";
}
std::string PsSeries(const std::string& name) { return name + "{shard=\"0\",task=\"ps:0\"}"; }

// The metric families a scrape declares (its "# TYPE name type" lines).
std::set<std::string> Families(const std::string& text) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() == 4 && parts[0] == "#" && parts[1] == "TYPE") names.insert(parts[2]);
  }
  return names;
}

// The metric names of the README's metrics table: each `pst_...` in the
// first column of a row.
std::set<std::string> ReadmeMetrics() {
  std::set<std::string> names;
  const std::string readme = ReadFile(std::string(PST_SOURCE_DIR) + "/README.md");
  for (absl::string_view line : absl::StrSplit(readme, '\n')) {
    if (!absl::StartsWith(line, "| `pst_")) continue;
    std::vector<absl::string_view> cells = absl::StrSplit(line, '|');
    std::vector<absl::string_view> quoted = absl::StrSplit(cells[1], '`');
    for (size_t i = 1; i < quoted.size(); i += 2) names.insert(std::string(quoted[i]));
  }
  return names;
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    freopen(log.c_str(), "w", stdout);
    dup2(fileno(stdout), fileno(stderr));
    std::vector<std::string> full = {"/usr/bin/timeout", "-k", "5", "120"};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

std::string JobConfig(int grpc_port, int workers, int epochs) {
  return absl::StrCat("cluster { ps: \"127.0.0.1:", grpc_port, "\" workers: ", workers, " }\n",
                      "training { optimizer { adam { learning_rate: 0.002 } } batch_size: 32\n",
                      "  epochs: ", epochs, " log_every_steps: 20 model { mlp { hidden: 32 } }\n",
                      "  dataset { fashion_mnist { train_limit: 2000 } } }\n");
}

// A real ps_server and worker, each with --metrics_port: while the worker
// trains, both endpoints answer with the documented metrics, labelled with
// their task, shard, worker and variable, and they count.
TEST(MetricsEndpointTest, PsAndWorkerServeMetricsWhileTraining) {
  const int ports = MetricsPorts(2);
  ASSERT_GT(ports, 0);
  const std::string ps_config = ScratchDir() + "/metrics-ps.textproto";
  std::ofstream(ps_config) << JobConfig(0, 1, 2);
  const std::string port_file = ScratchDir() + "/metrics-ps.port";
  pid_t ps = Spawn({Bin("ps_server"), "--config=" + ps_config, "--task=ps:0",
                    absl::StrCat("--metrics_port=", ports), "--port_file=" + port_file},
                   ScratchDir() + "/ps.log");
  const int grpc_port = AwaitPortFile(port_file, ps);
  if (grpc_port == 0) {
    kill(ps, SIGKILL);
    waitpid(ps, nullptr, 0);
    FAIL() << "the PS reported no port: " << ReadFile(ScratchDir() + "/ps.log");
  }
  const std::string config = ScratchDir() + "/metrics.textproto";
  std::ofstream(config) << JobConfig(grpc_port, 1, 2);
  // The worker slowed down (tests/support/slow_worker.cc), so that the
  // scrapes below catch it while it trains.
  pid_t worker = Spawn({PST_SLOW_WORKER, "--config=" + config, "--task=worker:0",
                        absl::StrCat("--metrics_port=", ports + 1), "--step_delay_ms=20"},
                       ScratchDir() + "/worker.log");

  std::string worker_text;
  std::map<std::string, double> w;
  // Past the first progress window (log_every_steps: 20), which records the
  // gradients' norms.
  Eventually(
      [&] {
        worker_text = Scrape(ports + 1);
        w = Parse(worker_text);
        return w[WorkerSeries("pst_worker_steps_total")] >= 25;
      },
      absl::Seconds(60), absl::Milliseconds(100));  // checked below
  const std::string ps_text = Scrape(ports);
  std::map<std::string, double> p = Parse(ps_text);
  int status = 0;
  waitpid(worker, &status, 0);
  kill(ps, SIGTERM);
  int ps_status = 0;
  waitpid(ps, &ps_status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(ScratchDir() + "/worker.log");
  // With its metrics server running too, SIGTERM stops the PS gracefully
  // (the server's threads once took the signal's default action).
  EXPECT_TRUE(WIFEXITED(ps_status) && WEXITSTATUS(ps_status) == 0)
      << "ps_server ended with wait status " << ps_status << ": "
      << ReadFile(ScratchDir() + "/ps.log");

  // Every series names its process: task and the worker's index.
  EXPECT_GE(w[WorkerSeries("pst_worker_steps_total")], 25) << ReadFile(ScratchDir() + "/worker.log");
  // Only the first step pulls; every step's exchange brings the next one's
  // parameters back (PsClient::PushPull).
  EXPECT_GE(w[WorkerSeries("pst_worker_pull_seconds_count")], 1);
  EXPECT_GE(w[WorkerSeries("pst_worker_push_seconds_count")], 25);
  EXPECT_GE(w["pst_worker_step_seconds_bucket{task=\"worker:0\",worker=\"0\",le=\"+Inf\"}"], 25);
  EXPECT_GT(w[WorkerSeries("pst_worker_sent_bytes_total")], 0);
  EXPECT_GT(w[WorkerSeries("pst_worker_received_bytes_total")], 0);
  EXPECT_EQ(w.count(WorkerSeries("pst_worker_samples_per_second")), 1u);
  // Per shard: shard="0" as well.
  EXPECT_GE(w["pst_worker_push_staleness_bucket{task=\"worker:0\",worker=\"0\",shard=\"0\","
              "le=\"0\"}"],
            25);
  EXPECT_EQ(w.count("pst_worker_pushes_dropped_total{task=\"worker:0\",worker=\"0\",shard=\"0\"}"),
            1u);
  EXPECT_GE(w["pst_worker_version{task=\"worker:0\",worker=\"0\",shard=\"0\"}"], 25);
  // Per variable: one gradient norm for each of the MLP's variables.
  int norms = 0;
  for (const auto& [series, value] : w) {
    if (series.rfind("pst_worker_gradient_norm{task=\"worker:0\",worker=\"0\",variable=\"", 0) == 0) {
      ++norms;
      EXPECT_GT(value, 0) << series;
    }
  }
  EXPECT_GE(norms, 2) << worker_text;

  // The PS's series: task and the shard's index.
  EXPECT_GE(p[PsSeries("pst_ps_pushes_applied_total")], 25) << ReadFile(ScratchDir() + "/ps.log");
  EXPECT_GE(p[PsSeries("pst_ps_version")], 25);
  EXPECT_EQ(p[PsSeries("pst_ps_live_workers")], 1);
  EXPECT_EQ(p[PsSeries("pst_ps_pushes_dropped_total")], 0);
  EXPECT_GE(p[PsSeries("pst_ps_push_seconds_count")], 25);
  EXPECT_GE(p[PsSeries("pst_ps_pull_seconds_count")], 25);
  EXPECT_GE(p["pst_ps_push_staleness_bucket{shard=\"0\",task=\"ps:0\",le=\"0\"}"], 25);  // SYNC
  EXPECT_GT(p[PsSeries("pst_ps_received_bytes_total")], 0);
  EXPECT_GT(p[PsSeries("pst_ps_sent_bytes_total")], 0);
  // Per worker: worker="0" as well.
  EXPECT_GE(p["pst_ps_worker_pushes_total{shard=\"0\",task=\"ps:0\",worker=\"0\"}"], 25);
  EXPECT_EQ(p["pst_ps_worker_live{shard=\"0\",task=\"ps:0\",worker=\"0\"}"], 1);

  // The README's table names exactly the metrics the two processes serve
  // (tests/deploy/grafana_dashboard_test.py checks the dashboard against it).
  std::set<std::string> served = Families(worker_text);
  served.merge(Families(ps_text));
  EXPECT_EQ(served, ReadmeMetrics());
  EXPECT_THAT(ReadFile(ScratchDir() + "/ps.log"),
              HasSubstr(absl::StrCat("ps:0 metrics on http://127.0.0.1:", ports, "/metrics")));
}

// pslaunch --metrics_port maps ports in task order and logs it; --logdir
// makes the chief write an event file; --report writes the page and record.
TEST(PslaunchObservabilityTest, MetricsMappingEventFileAndReport) {
  const int ports = MetricsPorts(3);
  ASSERT_GT(ports, 0);
  const std::string dir = ScratchDir() + "/launch";
  const std::string config = ScratchDir() + "/launch.textproto";
  std::ofstream(config) << JobConfig(0, 2, 2);
  const std::string command = absl::StrCat(
      "timeout -k 5 240 ", Bin("pslaunch"), " --config=", config, " --metrics_port=", ports,
      " --logdir=", dir, "/tb --report=", dir, "/run.html >", ScratchDir(), "/launch.out 2>",
      ScratchDir(), "/launch.err </dev/null");
  std::filesystem::create_directories(dir);
  int status = std::system(command.c_str());
  const std::string err = ReadFile(ScratchDir() + "/launch.err");
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  EXPECT_THAT(err, HasSubstr(absl::StrCat("ps:0=", ports, " worker:0=", ports + 1,
                                          " worker:1=", ports + 2)));

  std::vector<std::filesystem::path> events;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/tb")) {
    events.push_back(entry.path());
  }
  ASSERT_EQ(events.size(), 1u) << "only the chief writes events";
  EXPECT_EQ(events[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  const std::string event_bytes = ReadFile(events[0].string());
  for (const char* tag : {"brain.Event:2", "train/loss", "train/samples_per_sec",
                          "train/staleness", "test/accuracy", "test/loss"}) {
    EXPECT_THAT(event_bytes, HasSubstr(tag));
  }

  const std::string page = ReadFile(dir + "/run.html");
  EXPECT_THAT(page, HasSubstr("<svg"));
  // The run's label names the job's training settings (JobConfig above).
  EXPECT_THAT(page, HasSubstr("sync, 2 workers, adam lr 0.002, batch 32 · worker:1"));
  const std::string record = ReadFile(dir + "/run.json");
  EXPECT_THAT(record, HasSubstr("\"curve\""));
  EXPECT_THAT(record, HasSubstr("\"evals\""));
  EXPECT_THAT(record, ::testing::ContainsRegex("\"steps\":[0-9]+,"));

  // psreport draws two records on one page.
  const std::string merged = dir + "/compare.html";
  ASSERT_EQ(std::system(absl::StrCat(Bin("psreport"), " --out=", merged, " --labels=a,b ", dir,
                                     "/run.json ", dir, "/run.json >/dev/null").c_str()),
            0);
  EXPECT_THAT(ReadFile(merged), HasSubstr("pstrain run: a vs b"));
  EXPECT_EQ(WEXITSTATUS(std::system(absl::StrCat(Bin("psreport"), " /no/such.json 2>/dev/null")
                                        .c_str())),
            2);
}

// Bad observability flags: one line naming the flag, exit code 2, before
// any slow start-up work.
TEST(ObservabilityErrorsTest, BadFlagsGiveOneLineAndExitCodeTwo) {
  // The workers read this config too: they take no port 0. Each binary
  // refuses its flags before it binds or connects anything.
  const std::string config = ScratchDir() + "/errors.textproto";
  std::ofstream(config) << JobConfig(1, 1, 1);
  const std::string any_port = ScratchDir() + "/any_port.textproto";
  std::ofstream(any_port) << JobConfig(0, 1, 1);
  // A port something listens on.
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int taken = ntohs(address.sin_port);
  struct Case {
    std::string command;
    std::string message;
  };
  const std::vector<Case> cases = {
      {absl::StrCat(Bin("ps_server"), " --config=", config, " --metrics_port=70000"),
       "ps_server: error: --metrics_port: metrics port 70000 is not in 0..65535"},
      {absl::StrCat(Bin("worker"), " --config=", config, " --metrics_port=9",
                    " --metrics_address=localhost"),
       "worker: error: --metrics_port: metrics address \"localhost\" is not an IP address"},
      {absl::StrCat(Bin("worker"), " --config=", config, " --logdir=/proc/nope"),
       "worker: error: cannot create --logdir /proc/nope"},
      {absl::StrCat(Bin("pslaunch"), " --config=", config, " --metrics_port=-3"),
       "pslaunch: error: --metrics_port=-3 is not a port"},
      // Checked before any task starts: no task fails after its peers began.
      {absl::StrCat(Bin("pslaunch"), " --config=", any_port, " --metrics_port=65535"),
       "pslaunch: error: --metrics_port=65535 gives the 2 tasks the ports 65535..65536"},
      {absl::StrCat(Bin("pslaunch"), " --config=", any_port, " --metrics_port=", taken),
       absl::StrCat("pslaunch: error: --metrics_port=", taken, " gives ps:0 port ", taken,
                    " on 127.0.0.1: the port is in use")},
      {Bin("psreport"), "psreport: error: name at least one run record"},
  };
  for (const Case& c : cases) {
    const std::string err = ScratchDir() + "/error.err";
    int status = std::system(
        absl::StrCat("timeout -k 5 30 ", c.command, " >/dev/null 2>", err, " </dev/null").c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << c.command;
    const std::string text = ReadFile(err);
    EXPECT_EQ(text.rfind(c.message, 0), 0u) << c.command << "\n" << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  }
  close(listener);
}

}  // namespace PST_FILE_ID
}  // namespace pst
