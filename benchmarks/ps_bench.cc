// ps_bench: the data plane alone. Workers push a gradient of a dense model
// to the PS shards and get the model back (one PushPull per shard, or a Push
// and then a Pull with --exchange=push_then_pull), as fast as they can, over
// gRPC on 127.0.0.1 or through shared memory (--transport), or to running
// shards (--ps); no compute. The tensors lie where the trainer keeps them
// (PsClient::AllocateTensors: in the region when shared). Sweeps model size, and prints GB/s and
// latency percentiles next to three baselines measured in the same run: a
// plain small gRPC call (the Heartbeat RPC: our stack's echo), when iperf3
// is installed loopback TCP with 1 MiB writes, and a warm memcpy of the
// row's size. --peer_json adds another program's rows (a peer such as
// ps-lite, same fields) and the ratios against them.
//
// Each shard is a ps_server process, as deployed (--shard_processes=false:
// threads of this process); workers are threads of this process, each with
// its own channel; bytes are counted as they travel (at the wire dtype). On
// a shared host loopback bandwidth drifts from minute to minute, so iperf3
// runs right before each row and right after it, and the row is compared
// with the mean of the two (`of_iperf3`). The echo is timed the same way,
// on the row's own connection: the first worker sends heartbeats to shard 0
// right before the row's measured window and right after it. (Timed once, on a
// cluster of its own, before the first row, it caught a moment of an idle,
// fresh process: 48-94 us in some runs, 140-250 us in others, while the
// same heartbeats interleaved with a row's round trips took 86-274 us;
// docs/benchmarks.md.)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmarks/byte_sizes.h"
#include "benchmarks/process_cpu.h"
#include "benchmarks/ps_server_processes.h"
#include "benchmarks/yardsticks.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/mutex_checks.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "rpc/grpc_experiments.h"
#include "common/security.h"
#include "common/tensor_codec.h"
#include "placement/variable_spec.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/service/ps_service.h"
#include "rpc/grpc_status.h"
#include "spdlog/spdlog.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(std::string, sizes, "4KiB,4MiB,64MiB", "Model sizes (float32 bytes): B, KiB, MiB, GiB.");
ABSL_FLAG(int, shards, 1, "PS shards.");
ABSL_FLAG(double, seconds, 3.0, "Measuring time per row (after one warm-up round trip).");
ABSL_FLAG(bool, json, false, "One JSON object per row instead of a table.");
ABSL_FLAG(bool, iperf, true, "Measure loopback TCP with iperf3 when it is installed.");
ABSL_FLAG(std::string, exchange, "push_pull",
          "How a round trip goes: push_pull (one PushPull call per shard, as the trainer "
          "steps) or push_then_pull (a Push, then a Pull).");
ABSL_FLAG(bool, shard_processes, true,
          "Run each shard as a ps_server process (from beside ps_bench), as deployed. "
          "false: shards are threads of this process, sharing its gRPC pollers with the "
          "workers.");
ABSL_FLAG(std::string, transport, "auto",
          "How tensors travel: auto (shared memory with shards on this host, as training "
          "does; TCP otherwise), tcp (gRPC over the socket) or shm (shared memory, or fail).");
ABSL_FLAG(std::string, peer_json, "",
          "A file of rows another program measured (one JSON object per line with at least "
          "size_bytes or size, workers and push_pull_gbps; optionally cpu_us_per_round_trip "
          "and p50_us): each of our rows is printed with the peer's row of the same size and "
          "workers, and the ratios ours / peer.");
ABSL_FLAG(std::string, ps, "",
          "Comma-separated addresses of running ps_server shards (ASYNC, SGD) to measure "
          "against, e.g. across a network, instead of starting shards of its own; one size per "
          "run, since a shard keeps the first model it is given. --shards is then their "
          "number.");
ABSL_FLAG(int, first_worker, 0,
          "The rank of this process's first worker thread (the others follow): with --ps, "
          "several ps_bench processes share the shards as distinct workers.");
ABSL_FLAG(std::string, ready_file, "",
          "After the warm-up, write a line to this file (a FIFO) and wait for a line on "
          "standard input before the measured window: ps_bench processes started apart (e.g. in "
          "network namespaces of their own) then measure over the same window.");

namespace pst {
namespace {

double Percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()))];
}

// The addresses --ps names (none: shards in this process).
std::vector<std::string> RunningShards() {
  return absl::StrSplit(absl::GetFlag(FLAGS_ps), ',', absl::SkipEmpty());
}

struct Cluster {
  std::vector<std::unique_ptr<ParameterShard>> shards;
  std::vector<RunningServer> servers;
  std::unique_ptr<PsServerProcesses> processes;  // --shard_processes
  std::vector<std::string> addresses;
  // CPU time of this process and of the shard processes.
  double CpuSeconds() const {
    return ProcessCpuSeconds(getpid()) + (processes ? processes->CpuSeconds() : 0);
  }
  ~Cluster() {
    for (auto& s : shards) s->BeginShutdown();
    for (auto& s : servers) s.grpc_server->Shutdown();
  }
};

// A 256 MiB model's Init is just over ps_server's default limit; the shards
// started here take what the swept model needs. `model_bytes`: the whole
// model as float32, which the workers' Init sends to the shards in one
// request per shard.
int MaxRequestBytes(int64_t model_bytes) {
  const int64_t limit = std::max<int64_t>(kDefaultMaxRequestBytes, model_bytes + (1 << 20));
  return static_cast<int>(std::min<int64_t>(limit, kMaxMessageBytes));
}

absl::Status StartCluster(int shards, int workers, int64_t model_bytes, Cluster* cluster) {
  if (absl::GetFlag(FLAGS_shard_processes)) {
    absl::StatusOr<std::unique_ptr<PsServerProcesses>> processes =
        PsServerProcesses::Start(shards, workers, MaxRequestBytes(model_bytes));
    if (!processes.ok()) return processes.status();
    cluster->processes = std::move(*processes);
    cluster->addresses = cluster->processes->addresses();
    return absl::OkStatus();
  }
  for (int i = 0; i < shards; ++i) {
    ShardOptions options;
    options.mode = ASYNC;
    options.num_workers = workers;
    options.shard = i;
    options.num_shards = shards;
    options.optimizer.mutable_sgd()->set_learning_rate(1.0f);
    absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
    if (!shard.ok()) return shard.status();
    absl::StatusOr<RunningServer> server =
        StartGrpcServer("127.0.0.1:0", shard->get(), AdminHooks{}, ClusterSecurity::Plaintext(),
                        RpcLimits{.max_request_bytes = MaxRequestBytes(model_bytes)});
    if (!server.ok()) return server.status();
    cluster->addresses.push_back(absl::StrCat("127.0.0.1:", server->port));
    cluster->shards.push_back(std::move(*shard));
    cluster->servers.push_back(std::move(*server));
  }
  return absl::OkStatus();
}

struct Row {
  int64_t size = 0;
  double gbps = 0;
  double p50_us = 0, p99_us = 0;
  int64_t round_trips = 0;
  int64_t wire_bytes_per_round_trip = 0;
  int64_t fp32_bytes_per_round_trip = 0;  // the same model as float32
  // CPU time (user + system, every thread of every process: workers, shards
  // and gRPC) per round trip. A shared host's noise moves it far less than
  // the wall-clock figures, so before/after comparisons of a change read it
  // first.
  double cpu_us_per_round_trip = 0;
  double echo_p50_us = 0;  // heartbeats on the first worker's connection to shard 0
  bool shared_memory = false;  // the first worker's tensors went through shared memory
};

// Heartbeats to shard 0 on `client`'s connection, timed into `micros`.
absl::Status TimeEcho(PsClient* client, int calls, std::vector<double>* micros) {
  for (int i = 0; i < calls; ++i) {
    const absl::Time start = absl::Now();
    PST_RETURN_IF_ERROR(client->Heartbeat(0));
    micros->push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  return absl::OkStatus();
}

// --ready_file: says this process is ready, then waits for the go on stdin.
absl::Status AwaitStartSignal() {
  const std::string path = absl::GetFlag(FLAGS_ready_file);
  if (path.empty()) return absl::OkStatus();
  {
    std::ofstream ready(path, std::ios::app);
    ready << getpid() << " ready" << std::endl;
    if (!ready) return absl::UnavailableError(absl::StrCat("--ready_file: cannot write ", path));
  }
  std::string line;
  if (!std::getline(std::cin, line)) {
    return absl::UnavailableError("--ready_file: standard input closed before the start signal");
  }
  return absl::OkStatus();
}

absl::StatusOr<Row> MeasurePushPull(int64_t size_bytes, int workers, int shards, DType dtype,
                                    PsClient::Transport transport) {
  Cluster cluster;
  const std::vector<std::string> external = RunningShards();
  if (!external.empty()) {
    cluster.addresses = external;
  } else if (absl::Status s = StartCluster(shards, absl::GetFlag(FLAGS_first_worker) + workers,
                                          size_bytes, &cluster);
             !s.ok()) {
    return s;
  }
  const bool push_pull = absl::GetFlag(FLAGS_exchange) == "push_pull";
  const int64_t elements = std::max<int64_t>(1, size_bytes / 4);
  // A matrix, so that big models are sliced across shards like real ones.
  const int64_t rows = elements >= 1024 ? 1024 : 1;
  const std::vector<VariableSpec> model = {{"w", {rows, elements / rows}}};
  const int64_t used = model[0].size();
  std::atomic<bool> stop{false};
  absl::Mutex failure_mu;
  absl::Status failure;  // the first one
  auto fail = [&](absl::Status status) {
    absl::MutexLock lock(&failure_mu);
    if (failure.ok()) failure = std::move(status);
  };
  std::vector<std::vector<double>> latencies(workers);
  std::vector<double> echo_micros;  // the first worker's, around the window
  constexpr int kEchoCalls = 1000;
  bool used_shared_memory = false;  // the first worker's, written before it settles
  absl::Mutex start_mu;
  int settled = 0;   // workers past their warm-up, or failed before it
  int finished = 0;  // workers past their last round trip, or failed
  bool started = false;  // the measured window is open
  auto worker = [&](int rank) {
    // Each counts a worker once, when it gets there or when it fails first:
    // a failed worker must not hold the measurement (and the report of its
    // failure) up.
    bool counted_settled = false, counted_finished = false;
    auto settle = [&] {
      if (counted_settled) return;
      counted_settled = true;
      absl::MutexLock lock(&start_mu);
      ++settled;
    };
    auto finish = [&] {
      if (counted_finished) return;
      counted_finished = true;
      absl::MutexLock lock(&start_mu);
      ++finished;
    };
    absl::Cleanup count_on_exit = [&] {
      settle();
      finish();
    };
    auto client = PsClient::Connect(cluster.addresses, absl::GetFlag(FLAGS_first_worker) + rank,
                                    absl::Seconds(10));
    if (!client.ok()) {
      fail(client.status());
      return;
    }
    (*client)->SetVariables(model);
    (*client)->set_wire_dtype(dtype);
    (*client)->set_transport(transport);
    // Where the trainer keeps them: in the shard's region when shared.
    absl::StatusOr<PsClient::Tensors> tensors = (*client)->AllocateTensors();
    if (!tensors.ok()) {
      fail(tensors.status());
      return;
    }
    const std::span<float> params = tensors->values[0], grads = tensors->gradients[0];
    std::fill(params.begin(), params.end(), 0.0f);
    std::fill(grads.begin(), grads.end(), 1e-12f);
    if (absl::StatusOr<bool> init = (*client)->Init({params}); !init.ok()) fail(init.status());
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    if (absl::Status s = (*client)->Exchange({.min_versions = std::vector<int64_t>(shards, 0),
                                              .timeout = absl::Seconds(30),
                                              .values = {params}},
                                             &versions, nullptr);
        !s.ok()) {
      fail(s);
      return;
    }
    // A training step's exchange: the gradient goes out, the new parameters
    // come back (PsClient::PushPull), as the trainer does it.
    auto round_trip = [&]() {
      const std::vector<int64_t> computed_at = versions;
      absl::Status s;
      if (push_pull) {
        s = (*client)->Exchange({.computed_at = computed_at,
                                 .gradients = {grads},
                                 .min_versions = computed_at,
                                 .timeout = absl::Seconds(30),
                                 .values = {params}},
                                &versions, &responses);
      } else {
        s = (*client)->Exchange({.computed_at = computed_at, .gradients = {grads}}, nullptr,
                                &responses);
        if (s.ok())
          s = (*client)->Exchange(
              {.min_versions = computed_at, .timeout = absl::Seconds(30), .values = {params}},
              &versions, nullptr);
      }
      if (!s.ok()) fail(s);
      return s.ok();
    };
    if (!round_trip()) return;  // warm-up: connections, first-touch buffers
    if (rank == 0) {
      used_shared_memory = (*client)->uses_shared_memory(0);
      if (absl::Status s = TimeEcho(client->get(), kEchoCalls, &echo_micros); !s.ok()) {
        fail(s);
        return;
      }
    }
    settle();
    {  // all start together, after the first worker's opening echo and the start signal
      absl::MutexLock lock(&start_mu);
      const auto may_start = [&] { return started; };
      start_mu.Await(absl::Condition(&may_start));
    }
    while (!stop.load()) {
      absl::Time start = absl::Now();
      if (!round_trip()) return;
      latencies[rank].push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    finish();
    if (rank == 0) {
      if (absl::Status s = TimeEcho(client->get(), kEchoCalls, &echo_micros); !s.ok()) fail(s);
    }
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) threads.emplace_back(worker, rank);
  {
    absl::MutexLock lock(&start_mu);
    const auto all_settled = [&] { return settled == workers; };
    start_mu.Await(absl::Condition(&all_settled));
  }
  const absl::Status start_signal = AwaitStartSignal();
  if (!start_signal.ok()) stop = true;
  {
    absl::MutexLock lock(&start_mu);
    started = true;
  }
  absl::Time begin = absl::Now();
  const double cpu_begin = cluster.CpuSeconds();
  if (start_signal.ok()) absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
  stop = true;
  {
    absl::MutexLock lock(&start_mu);
    const auto all_finished = [&] { return finished == workers; };
    start_mu.Await(absl::Condition(&all_finished));
  }
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - begin);
  const double cpu_seconds = cluster.CpuSeconds() - cpu_begin;
  for (std::thread& t : threads) t.join();  // after the first worker's closing echo
  if (!start_signal.ok()) return start_signal;
  if (!failure.ok()) {
    return absl::Status(failure.code(), absl::StrCat("a worker's call failed: ", failure.message()));
  }
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Row row;
  row.size = size_bytes;
  row.round_trips = static_cast<int64_t>(all.size());
  row.wire_bytes_per_round_trip = 2 * used * DTypeBytes(dtype);
  row.fp32_bytes_per_round_trip = 2 * used * static_cast<int64_t>(sizeof(float));
  row.gbps = row.round_trips * static_cast<double>(row.wire_bytes_per_round_trip) / elapsed / 1e9;
  row.cpu_us_per_round_trip = row.round_trips > 0 ? cpu_seconds * 1e6 / row.round_trips : 0;
  row.p50_us = Percentile(all, 0.50);
  row.p99_us = Percentile(all, 0.99);
  std::sort(echo_micros.begin(), echo_micros.end());
  row.echo_p50_us = Percentile(echo_micros, 0.50);
  row.shared_memory = used_shared_memory;
  return row;
}

int Main() {
  absl::StatusOr<std::vector<int64_t>> parsed = ParseByteSizes(absl::GetFlag(FLAGS_sizes));
  if (!parsed.ok()) ExitWithError("ps_bench", parsed.status());
  const std::vector<int64_t> sizes = std::move(*parsed);
  // --workers and --wire_dtype are the flags every binary shares.
  JobConfig overridden;
  if (absl::Status s = ApplyOverrides(OverridesFromFlags(), &overridden); !s.ok()) {
    ExitWithError("ps_bench", s);
  }
  const DType dtype = WireDType(overridden.training().wire_dtype());
  const int workers = std::max(1, overridden.cluster().workers());
  const std::vector<std::string> external = RunningShards();
  const int shards = external.empty() ? absl::GetFlag(FLAGS_shards)
                                      : static_cast<int>(external.size());
  const bool json = absl::GetFlag(FLAGS_json);
  const std::string exchange = absl::GetFlag(FLAGS_exchange);
  if (exchange != "push_pull" && exchange != "push_then_pull") {
    ExitWithError("ps_bench", absl::InvalidArgumentError(absl::StrCat(
                                  "--exchange=", exchange, ": use push_pull or push_then_pull")));
  }
  PsClient::Transport transport;
  const std::string transport_name = absl::GetFlag(FLAGS_transport);
  if (transport_name == "auto") {
    transport = PsClient::Transport::kAuto;
  } else if (transport_name == "tcp") {
    transport = PsClient::Transport::kTcp;
  } else if (transport_name == "shm") {
    transport = PsClient::Transport::kShm;
  } else {
    ExitWithError("ps_bench", absl::InvalidArgumentError(absl::StrCat(
                                  "--transport=", transport_name, ": use auto, tcp or shm")));
  }
  std::vector<PeerRow> peers;
  if (const std::string path = absl::GetFlag(FLAGS_peer_json); !path.empty()) {
    absl::StatusOr<std::vector<PeerRow>> read = ReadPeerRows(path);
    if (!read.ok()) ExitWithError("ps_bench", read.status());
    peers = std::move(*read);
  }
  if (absl::GetFlag(FLAGS_first_worker) < 0) {
    ExitWithError("ps_bench", absl::InvalidArgumentError("--first_worker: give 0 or more"));
  }
  if (!external.empty() && sizes.size() != 1) {
    ExitWithError("ps_bench", absl::InvalidArgumentError(
                                  "--ps: give one size (--sizes): a running shard keeps the "
                                  "first model it is given"));
  }

  std::optional<double> iperf = absl::GetFlag(FLAGS_iperf) ? IperfGbps() : std::nullopt;
  if (!json) {
    const std::string iperf_text =
        iperf ? absl::StrFormat("%.2f GB/s", *iperf)
              : (absl::GetFlag(FLAGS_iperf) ? "n/a (iperf3 not installed)" : "not run (--iperf=false)");
    std::printf("baselines: iperf3 loopback (1 MiB writes) %s; gRPC echo p50 around each row "
                "(echo_us)\n",
                iperf_text.c_str());
    std::printf("%-8s %7s %6s %8s %9s %10s %10s %10s %10s %12s %12s %12s %12s %16s", "size",
                "workers", "shards", "dtype", "transport", "GB/s", "p50_us", "p99_us", "echo_us",
                "round_trips", "cpu_us/trip", "iperf3_GB/s", "memcpy_GB/s", "wire_MB/trip");
    if (!peers.empty()) {
      std::printf(" %10s %8s %12s", "peer_GB/s", "vs_peer", "cpu_vs_peer");
    }
    std::printf("\n");
  }
  for (int64_t size : sizes) {
    absl::StatusOr<Row> row = MeasurePushPull(size, workers, shards, dtype, transport);
    if (!row.ok()) ExitWithError("ps_bench", row.status());
    // The baseline around this row: the mean of the runs before and after.
    const std::optional<double> iperf_after = iperf ? IperfGbps() : std::nullopt;
    const std::optional<double> row_iperf =
        iperf && iperf_after ? std::optional<double>((*iperf + *iperf_after) / 2) : iperf;
    iperf = iperf_after ? iperf_after : iperf;
    const std::string iperf_text = row_iperf ? absl::StrFormat("%.2f", *row_iperf) : "null";
    const std::string ratio_text =
        row_iperf && *row_iperf > 0 ? absl::StrFormat("%.3f", row->gbps / *row_iperf) : "null";
    const std::string dtype_name = absl::AsciiStrToLower(DType_Name(dtype));
    const double memcpy_gbps = MemcpyGbps(size);
    const char* used_transport = row->shared_memory ? "shm" : "tcp";
    const std::optional<PeerRow> peer = FindPeer(peers, size, workers);
    const std::string peer_gbps =
        peer ? absl::StrFormat("%.3f", peer->gbps) : std::string("null");
    const std::string vs_peer = Ratio(row->gbps, peer ? std::optional(peer->gbps) : std::nullopt);
    const std::string cpu_vs_peer = Ratio(
        row->cpu_us_per_round_trip, peer ? peer->cpu_us_per_round_trip : std::nullopt);
    if (json) {
      std::printf("{\"size\":\"%s\",\"size_bytes\":%lld,\"workers\":%d,\"shards\":%d,\"wire_dtype\":\"%s\","
                  "\"push_pull_gbps\":%.3f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"round_trips\":%lld,"
                  "\"wire_bytes_per_round_trip\":%lld,\"bytes_saved_vs_fp32\":%lld,\"iperf3_gbps\":%s,"
                  "\"of_iperf3\":%s,\"echo_p50_us\":%.1f,\"cpu_us_per_round_trip\":%.0f,"
                  "\"exchange\":\"%s\",\"transport\":\"%s\",\"memcpy_gbps\":%.3f,"
                  "\"each_way_of_memcpy\":%.3f,\"peer_gbps\":%s,\"vs_peer\":%s,"
                  "\"cpu_vs_peer\":%s}\n",
                  ByteSizeName(size).c_str(), static_cast<long long>(size), workers, shards,
                  dtype_name.c_str(),
                  row->gbps, row->p50_us, row->p99_us, static_cast<long long>(row->round_trips),
                  static_cast<long long>(row->wire_bytes_per_round_trip),
                  static_cast<long long>(row->fp32_bytes_per_round_trip - row->wire_bytes_per_round_trip),
                  iperf_text.c_str(), ratio_text.c_str(), row->echo_p50_us, row->cpu_us_per_round_trip,
                  exchange.c_str(), used_transport, memcpy_gbps, row->gbps / 2 / memcpy_gbps,
                  peer_gbps.c_str(), vs_peer.c_str(), cpu_vs_peer.c_str());
    } else {
      std::printf("%-8s %7d %6d %8s %9s %10.3f %10.0f %10.0f %10.0f %12lld %12.0f %12s %12.2f "
                  "%6.2f (fp32 %.2f)",
                  ByteSizeName(size).c_str(), workers, shards, dtype_name.c_str(), used_transport,
                  row->gbps, row->p50_us, row->p99_us, row->echo_p50_us,
                  static_cast<long long>(row->round_trips), row->cpu_us_per_round_trip,
                  iperf_text.c_str(), memcpy_gbps, row->wire_bytes_per_round_trip / 1e6,
                  row->fp32_bytes_per_round_trip / 1e6);
      if (!peers.empty()) {
        std::printf(" %10s %8s %12s", peer_gbps.c_str(), vs_peer.c_str(), cpu_vs_peer.c_str());
      }
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::KeepLargeBuffersWarm();
  pst::SkipMutexDeadlockChecks();
  pst::EnableTransportExperiments();
  pst::ParseCommandLineFlags(
      argc, argv,
      "Push+pull throughput and latency of the PS data plane over loopback gRPC, by model size, "
      "next to iperf3 and gRPC-echo baselines from the same run.\n"
      "Usage: ps_bench --sizes=4KiB,4MiB,64MiB --workers=2 --shards=2 --wire_dtype=bf16 "
      "--transport=auto|tcp|shm [--peer_json=FILE] [--json]",
      pst::kBenchmark);
  spdlog::set_level(spdlog::level::warn);
  return pst::Main();
}
