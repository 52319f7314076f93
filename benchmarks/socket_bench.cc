// socket_bench: ps_bench's round trip over plain TCP sockets, the yardstick
// for any TCP transport on this host. A server process holds one float32
// model; each worker (a thread with its own loopback connection) sends a
// gradient of the whole model and receives the new values while it sends.
// The server applies one push at a time, as a shard stages one update at a
// time: it reads a block (--block, 64 KiB), subtracts it from the values
// and sends that block's new values back at once, so the answer flows while
// the push arrives, as our ASYNC exchange's does. No framing beyond an
// 8-byte length, no validation, no threads handing bytes over: what is left
// is what the kernel costs (a copy into the socket and one out of it each
// way) plus the update.
//
// Prints rows with ps_bench's field names (size, size_bytes, workers,
// push_pull_gbps counting both directions, p50_us, cpu_us_per_round_trip
// over both processes), so that its --json output is a --peer_json file
// for ps_bench.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "benchmarks/byte_sizes.h"
#include "benchmarks/process_cpu.h"
#include "common/exit.h"
#include "common/flags.h"

// The config override --workers (common/overrides.cc): clients at once.
ABSL_DECLARE_FLAG(int, workers);

ABSL_FLAG(std::string, sizes, "4KiB,4MiB,64MiB", "Model sizes (float32 bytes): B, KiB, MiB, GiB.");
ABSL_FLAG(double, seconds, 3.0, "Measuring time per row (after one warm-up round trip).");
ABSL_FLAG(int64_t, block, 64 << 10, "Bytes the server reads, applies and answers at a time.");
ABSL_FLAG(bool, json, false, "One JSON object per row (a --peer_json file for ps_bench).");

namespace pst {
namespace {

bool ReadAll(int fd, void* to, size_t bytes) {
  char* at = static_cast<char*>(to);
  while (bytes > 0) {
    const ssize_t n = recv(fd, at, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    bytes -= n;
  }
  return true;
}

bool WriteAll(int fd, const void* from, size_t bytes) {
  const char* at = static_cast<const char*>(from);
  while (bytes > 0) {
    const ssize_t n = send(fd, at, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    bytes -= n;
  }
  return true;
}

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The server process: accepts `workers` connections and answers each push
// until its worker closes the connection. Runs in a child forked before this
// process starts any thread of the row.
[[noreturn]] void Serve(int listener, int workers, int64_t model_bytes, int64_t block) {
  std::vector<float> values(model_bytes / 4, 0.0f);
  std::mutex update;  // one push applied at a time
  std::vector<std::thread> connections;
  for (int w = 0; w < workers; ++w) {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) _exit(1);
    NoDelay(fd);
    connections.emplace_back([&, fd] {
      std::vector<float> gradient(block / 4);
      for (uint64_t bytes = 0; ReadAll(fd, &bytes, sizeof(bytes));) {
        if (bytes != static_cast<uint64_t>(model_bytes)) break;
        std::lock_guard<std::mutex> lock(update);
        for (int64_t offset = 0; offset < model_bytes; offset += block) {
          const int64_t part = std::min(block, model_bytes - offset);
          if (!ReadAll(fd, gradient.data(), part)) return;
          float* at = values.data() + offset / 4;
          for (int64_t i = 0; i < part / 4; ++i) at[i] -= gradient[i];
          if (!WriteAll(fd, at, part)) return;
        }
      }
      close(fd);
    });
  }
  for (std::thread& t : connections) t.join();
  _exit(0);
}

struct Row {
  double gbps = 0, p50_us = 0, cpu_us_per_round_trip = 0;
  int64_t round_trips = 0;
};

// One worker's connection: the push is sent from the calling thread while a
// second thread receives the answer into `values`.
class Worker {
 public:
  Worker(int fd, int64_t model_bytes)
      : fd_(fd), gradient_(model_bytes / 4, 1e-12f), values_(model_bytes / 4),
        receiver_([this] { Receive(); }) {}
  ~Worker() {
    shutdown(fd_, SHUT_RDWR);
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    receiver_.join();
    close(fd_);
  }

  bool RoundTrip() {
    {
      absl::MutexLock lock(&mu_);
      ++asked_;
    }
    const uint64_t bytes = gradient_.size() * sizeof(float);
    if (!WriteAll(fd_, &bytes, sizeof(bytes)) || !WriteAll(fd_, gradient_.data(), bytes)) return false;
    absl::MutexLock lock(&mu_);
    const auto answered = [this] { return failed_ || answered_ == asked_; };
    mu_.Await(absl::Condition(&answered));
    return !failed_;
  }

 private:
  void Receive() {
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        const auto wanted = [this] { return closing_ || answered_ < asked_; };
        mu_.Await(absl::Condition(&wanted));
        if (closing_) return;
      }
      const bool ok = ReadAll(fd_, values_.data(), values_.size() * sizeof(float));
      absl::MutexLock lock(&mu_);
      if (!ok) {
        failed_ = true;
        return;
      }
      ++answered_;
    }
  }

  const int fd_;
  std::vector<float> gradient_, values_;
  absl::Mutex mu_;
  int64_t asked_ = 0, answered_ = 0;
  bool failed_ = false, closing_ = false;
  std::thread receiver_;
};

absl::StatusOr<Row> Measure(int64_t model_bytes, int workers) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, workers) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on 127.0.0.1: ", strerror(errno)));
  }
  const pid_t server = fork();
  if (server < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
  if (server == 0) Serve(listener, workers, model_bytes, absl::GetFlag(FLAGS_block));
  close(listener);

  std::vector<std::unique_ptr<Worker>> connected;
  for (int w = 0; w < workers; ++w) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      kill(server, SIGKILL);
      waitpid(server, nullptr, 0);
      return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1: ", strerror(errno)));
    }
    NoDelay(fd);
    connected.push_back(std::make_unique<Worker>(fd, model_bytes));
  }
  std::atomic<bool> stop{false}, failed{false};
  std::vector<std::vector<double>> latencies(workers);
  absl::Mutex start_mu;
  int warm = 0;
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      const bool ok = connected[w]->RoundTrip();  // warm-up: first-touch buffers
      {
        absl::MutexLock lock(&start_mu);
        ++warm;
      }
      if (!ok) {
        failed = true;
        return;
      }
      while (!stop.load()) {
        const absl::Time start = absl::Now();
        if (!connected[w]->RoundTrip()) {
          failed = true;
          return;
        }
        latencies[w].push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
      }
    });
  }
  {
    absl::MutexLock lock(&start_mu);
    const auto all_warm = [&] { return warm == workers; };
    start_mu.Await(absl::Condition(&all_warm));
  }
  const absl::Time begin = absl::Now();
  const double cpu_begin = ProcessCpuSeconds(getpid()) + ProcessCpuSeconds(server);
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
  stop = true;
  for (std::thread& t : threads) t.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - begin);
  const double cpu_seconds = ProcessCpuSeconds(getpid()) + ProcessCpuSeconds(server) - cpu_begin;
  connected.clear();  // the server's connections end, and with them the server
  int wait_status = 0;
  waitpid(server, &wait_status, 0);
  if (failed.load() || !WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError("a connection to the socket server failed");
  }
  std::vector<double> all;
  for (const std::vector<double>& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Row row;
  row.round_trips = static_cast<int64_t>(all.size());
  row.gbps = row.round_trips * 2.0 * model_bytes / elapsed / 1e9;
  row.p50_us = all.empty() ? 0 : all[all.size() / 2];
  row.cpu_us_per_round_trip = row.round_trips > 0 ? cpu_seconds * 1e6 / row.round_trips : 0;
  return row;
}

int Main() {
  absl::StatusOr<std::vector<int64_t>> sizes = ParseByteSizes(absl::GetFlag(FLAGS_sizes));
  if (!sizes.ok()) ExitWithError("socket_bench", sizes.status());
  for (int64_t size : *sizes) {
    if (size % 4 != 0) {
      ExitWithError("socket_bench", absl::InvalidArgumentError(absl::StrCat(
                                        "--sizes: ", size, " bytes is not a float32 model (a "
                                        "multiple of 4 bytes)")));
    }
  }
  // --workers is the flag every binary shares (0: keep the default, 1).
  const int workers = std::max(1, absl::GetFlag(FLAGS_workers));
  const int64_t block = absl::GetFlag(FLAGS_block);
  if (block < 4 || block % 4 != 0) {
    ExitWithError("socket_bench", absl::InvalidArgumentError(
                                      "--block must be a positive multiple of 4 bytes"));
  }
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("%-8s %7s %10s %10s %12s %12s\n", "size", "workers", "GB/s", "p50_us", "round_trips",
                "cpu_us/trip");
  }
  for (int64_t size : *sizes) {
    absl::StatusOr<Row> row = Measure(size, workers);
    if (!row.ok()) ExitWithError("socket_bench", row.status());
    if (json) {
      std::printf("{\"size\":\"%s\",\"size_bytes\":%lld,\"workers\":%d,\"push_pull_gbps\":%.3f,"
                  "\"p50_us\":%.1f,\"round_trips\":%lld,\"cpu_us_per_round_trip\":%.0f,"
                  "\"transport\":\"socket\"}\n",
                  ByteSizeName(size).c_str(), static_cast<long long>(size), workers, row->gbps,
                  row->p50_us, static_cast<long long>(row->round_trips), row->cpu_us_per_round_trip);
    } else {
      std::printf("%-8s %7d %10.3f %10.0f %12lld %12.0f\n", ByteSizeName(size).c_str(), workers,
                  row->gbps, row->p50_us, static_cast<long long>(row->round_trips),
                  row->cpu_us_per_round_trip);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::ParseCommandLineFlags(
      argc, argv,
      "ps_bench's round trip (push a gradient, get the model back) over plain TCP sockets on "
      "127.0.0.1: what the kernel alone costs, the yardstick for a TCP transport.\n"
      "Usage: socket_bench --sizes=4MiB,64MiB --workers=2 [--json > peer.json; "
      "ps_bench --transport=tcp --peer_json=peer.json]",
      pst::kBenchmark);
  return pst::Main();
}
