// pslite_bench: ps_bench's round trip on ps-lite (dmlc/ps-lite, ZeroMQ van),
// the peer that `ps_bench --peer_json` compares against. Not part of the
// build: scripts/pslite_peer.sh fetches ps-lite, compiles this file against
// it outside the repository and runs it.
//
// A round trip: each worker sends an M-byte float32 gradient and gets the
// M-byte model back, as ps-lite is used for speed: the tensor is split into
// 1 MiB keys, each one ZPushPull, all in flight at once, then waited for.
// The server applies SGD in place (w -= lr * g) and answers with the stored
// slice, without a copy (with two workers a key's next update may land while
// its answer is still being sent: the values are not checked, only timed). One process per role (scheduler, server, workers),
// started by the script with ps-lite's DMLC_* environment.
//
// Each process writes one line to $PSLITE_BENCH_OUT.<role>.<rank>:
//   worker: round_trips elapsed_s cpu_s p50_us
//   server: cpu_s (between the marks worker 0 sends around the window)
// CPU is the process's (all its threads: ZeroMQ's I/O thread included); the
// scheduler, idle while the window runs, is not counted.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

constexpr int kMarkStart = 1, kMarkEnd = 2;
constexpr size_t kKeyFloats = (1 << 20) / sizeof(float);  // 1 MiB keys

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

std::string OutPath(const char* role, int rank) {
  const char* base = std::getenv("PSLITE_BENCH_OUT");
  return std::string(base ? base : "pslite_bench") + "." + role + "." + std::to_string(rank);
}

struct Server {
  std::unordered_map<ps::Key, std::vector<float>> model;
  double cpu_at_start = 0;

  void Handle(const ps::KVMeta& meta, const ps::KVPairs<float>& request,
              ps::KVServer<float>* server) {
    if (meta.cmd == kMarkStart || meta.cmd == kMarkEnd) {
      if (meta.cmd == kMarkStart) {
        cpu_at_start = ProcessCpuSeconds();
      } else if (FILE* f = std::fopen(OutPath("server", ps::MyRank()).c_str(), "w")) {
        std::fprintf(f, "%.6f\n", ProcessCpuSeconds() - cpu_at_start);
        std::fclose(f);
      }
      server->Response(meta, ps::KVPairs<float>());
      return;
    }
    ps::KVPairs<float> response;
    response.keys = request.keys;
    size_t offset = 0;
    for (size_t i = 0; i < request.keys.size(); ++i) {
      const size_t n = request.lens.empty() ? request.vals.size() : request.lens[i];
      std::vector<float>& w = model[request.keys[i]];
      if (w.size() != n) w.assign(n, 0.f);
      if (meta.push) {
        const float* g = request.vals.data() + offset;
        for (size_t j = 0; j < n; ++j) w[j] -= 0.01f * g[j];
      }
      offset += n;
    }
    if (meta.pull) {
      // One key per request (the worker sends them apart): answer from the store.
      std::vector<float>& w = model[request.keys[0]];
      response.vals = ps::SArray<float>(w.data(), w.size(), false);
      response.lens = ps::SArray<int>(1, static_cast<int>(w.size()));
    }
    server->Response(meta, response);
  }
};

void RunWorker(size_t bytes, double seconds) {
  ps::KVWorker<float> kv(0, 0);
  const size_t floats = bytes / sizeof(float);
  std::vector<float> gradient(floats, 1.f), weights(floats, 0.f);
  struct Piece {
    ps::SArray<ps::Key> key;
    ps::SArray<float> grad, out;
    ps::SArray<int> len;
  };
  std::vector<Piece> pieces;
  for (size_t begin = 0, k = 0; begin < floats; begin += kKeyFloats, ++k) {
    const size_t n = std::min(kKeyFloats, floats - begin);
    Piece p;
    p.key = ps::SArray<ps::Key>(1, k);
    p.grad = ps::SArray<float>(gradient.data() + begin, n, false);
    p.out = ps::SArray<float>(weights.data() + begin, n, false);
    p.len = ps::SArray<int>(1, static_cast<int>(n));
    pieces.push_back(p);
  }
  std::vector<int> stamps(pieces.size());
  auto round_trip = [&] {
    for (size_t i = 0; i < pieces.size(); ++i) {
      stamps[i] = kv.ZPushPull(pieces[i].key, pieces[i].grad, &pieces[i].out, &pieces[i].len);
    }
    for (int ts : stamps) kv.Wait(ts);
  };
  auto mark = [&](int cmd) {
    if (ps::MyRank() != 0) return;
    ps::SArray<ps::Key> key(1, 0);
    ps::SArray<float> nothing;
    kv.Wait(kv.ZPush(key, nothing, {}, cmd));
  };
  round_trip();  // warm-up: connections, first-touch buffers
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  mark(kMarkStart);
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  using Clock = std::chrono::steady_clock;
  const double cpu_start = ProcessCpuSeconds();
  const Clock::time_point start = Clock::now();
  std::vector<double> latencies_us;
  Clock::time_point now = start;
  do {
    const Clock::time_point before = Clock::now();
    round_trip();
    now = Clock::now();
    latencies_us.push_back(std::chrono::duration<double, std::micro>(now - before).count());
  } while (std::chrono::duration<double>(now - start).count() < seconds);
  const double elapsed = std::chrono::duration<double>(now - start).count();
  const double cpu = ProcessCpuSeconds() - cpu_start;
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  mark(kMarkEnd);
  std::sort(latencies_us.begin(), latencies_us.end());
  if (FILE* f = std::fopen(OutPath("worker", ps::MyRank()).c_str(), "w")) {
    std::fprintf(f, "%zu %.6f %.6f %.1f\n", latencies_us.size(), elapsed, cpu,
                 latencies_us[latencies_us.size() / 2]);
    std::fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: pslite_bench BYTES SECONDS (roles from ps-lite's DMLC_* env)\n");
    return 2;
  }
  const size_t bytes = std::strtoull(argv[1], nullptr, 10);
  const double seconds = std::atof(argv[2]);
  ps::Start(0);
  Server state;
  ps::KVServer<float>* server = nullptr;
  if (ps::IsServer()) {
    server = new ps::KVServer<float>(0);
    server->set_request_handle(
        [&state](const ps::KVMeta& meta, const ps::KVPairs<float>& request,
                 ps::KVServer<float>* s) { state.Handle(meta, request, s); });
  }
  if (ps::IsWorker()) RunWorker(bytes, seconds);
  ps::Finalize(0, true);
  delete server;
  return 0;
}
