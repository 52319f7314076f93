// table_bench: one embedding table at scale, against ps_server processes on
// loopback (benchmarks/ps_server_processes.h), ASYNC, Adagrad (a row is
// dim values and dim accumulators: 8 * dim bytes raw).
//
//   --measure=scale  Fills the table to --rows rows over --shards (every id
//                 in [0, rows) pushed once, --fill_batch ids a push), then
//                 runs timed steps (PsClient's one-round-trip PushPull:
//                 --batch_rows uniform ids pushed, the next batch's rows
//                 pulled) for --rounds rounds of --seconds. Prints rows/s
//                 pulled and pushed, steps/s, and resident bytes per row:
//                 the shards' RSS (/proc) after the fill minus before it,
//                 over the rows held, beside the raw bytes of a row.
//   --measure=bound  Streams --rows distinct one-off ids (each pushed once)
//                 at one shard whose table holds at most --max_rows rows.
//                 Prints the shard's peak RSS over the run beside the
//                 bound the limit implies, and rows_refused (Stats) beside
//                 the ids sent.
//   --measure=stall  Push latency during a checkpoint, one shard: (a) a table
//                 of --rows rows, (b) a dense variable of the same bytes
//                 (values and accumulators) beside a small table. In each
//                 of --rounds rounds, each variant in turn: a fresh shard,
//                 filled, pushes of 256 rows back to back while an admin
//                 Checkpoint runs; the longest and median push latency
//                 during the checkpoint, the longest in as long a window
//                 just before it (at most 500 ms: the shard's own jitter),
//                 how long the capture held the shard's lock (Stats), and
//                 the checkpoint's time.
//                 --stall_variants picks among table, dense, delta and
//                 model: (c) the table of (a) checkpointed whole once,
//                 then --delta_rows of its rows trained, then a delta
//                 checkpoint (CheckpointConfig.full_every) timed as (a);
//                 (d) as (b) with the dense variables of the default job's
//                 model (the embedded default config's MLP). The delta of
//                 a 10^7-row table beside the dense checkpoints:
//                 --stall_variants=delta,dense,model --rows=10000000.
//
//   table_bench --measure=scale|bound|stall [--rows=10000000] [--dim=16]
//               [--shards=2] [--max_rows=1000000] [--json]
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmarks/median.h"
#include "benchmarks/process_cpu.h"
#include "benchmarks/ps_server_processes.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/mutex_checks.h"
#include "psctl/plan.h"
#include "spdlog/spdlog.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(std::string, measure, "scale", "scale, bound or stall.");
ABSL_FLAG(int64_t, rows, 10000000, "Rows filled (scale, stall) or one-off ids sent (bound).");
ABSL_FLAG(int, dim, 16, "Embedding dim.");
ABSL_FLAG(int, shards, 2, "PS shards (scale).");
ABSL_FLAG(int64_t, max_rows, 1000000, "The table's row limit on the shard (bound).");
ABSL_FLAG(int, fill_batch, 65536, "Ids per push while filling.");
ABSL_FLAG(int, batch_rows, 16384, "Unique ids per timed step (scale).");
ABSL_FLAG(int, rounds, 3, "Rounds: timed-step periods (scale) or variant pairs (stall).");
ABSL_FLAG(double, seconds, 3.0, "Seconds per timed-step round (scale).");
ABSL_FLAG(bool, json, false, "JSON rows instead of text.");
ABSL_FLAG(std::vector<std::string>, stall_variants, std::vector<std::string>({"table", "dense"}),
          "Stall: the checkpoints timed, of table, dense, delta and model.");
ABSL_FLAG(int64_t, delta_rows, 0,
          "Stall, delta: rows trained between the full checkpoint and the delta (0 = rows / 100).");

namespace pst {
namespace {

constexpr char kProgram[] = "table_bench";
constexpr char kOptimizer[] = "adagrad { learning_rate: 0.01 }";
constexpr int kDenseProbe = 256;  // the dense variable of scale and bound
constexpr int kStallPushRows = 256;
constexpr double kPushBuffers = 64 << 20;

template <typename T>
void Check(const absl::StatusOr<T>& result) {
  if (!result.ok()) ExitWithError(kProgram, result.status());
}
void Check(const absl::Status& status) {
  if (!status.ok()) ExitWithError(kProgram, status);
}

// One worker: a dense variable of `dense_floats` and the table "emb".
class TableClient {
 public:
  TableClient(const PsServerProcesses& shards, int64_t dense_floats, int dim, int64_t max_rows,
              EmbeddingTableConfig::WhenFull when_full = EmbeddingTableConfig::WHEN_FULL_UNSPECIFIED)
      : dim_(dim) {
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(shards.addresses(), 0, absl::Seconds(30));
    Check(client);
    client_ = std::move(*client);
    client_->SetVariables({{"dense", {dense_floats}}});
    EmbeddingTableConfig table;
    table.set_name("emb");
    table.set_dim(dim);
    table.set_max_rows_per_shard(max_rows);
    table.set_when_full(when_full);
    client_->SetEmbeddingTables({table});
    dense_.assign(kDenseProbe, 0.0f);
    versions_.assign(shards.addresses().size(), 0);
    Check(client_->Register());
    const std::vector<float> zeros(dense_floats, 0.0f);
    Check(client_->Init({zeros}));
  }

  // Pushes a gradient for each of `ids` (rows only).
  void PushRows(std::span<const uint64_t> ids) {
    gradients_.assign(ids.size() * dim_, 0.001f);
    RowGradients push{.table = 0, .ids = ids, .gradients = gradients_};
    std::vector<PushResponse> responses;
    Check(client_->Exchange({.computed_at = versions_, .push_rows = {&push, 1}}, nullptr,
                            &responses));
  }

  // One training step: push `ids`' gradients and the dense gradient, pull
  // `next`'s rows and the dense values.
  void Step(std::span<const uint64_t> ids, std::span<const uint64_t> next) {
    gradients_.assign(ids.size() * dim_, 0.001f);
    values_.resize(next.size() * dim_);
    RowGradients push{.table = 0, .ids = ids, .gradients = gradients_};
    RowValues pull{.table = 0, .ids = next, .values = values_};
    std::vector<PushResponse> responses;
    const std::vector<int64_t> at = versions_;
    Check(client_->Exchange({.computed_at = at,
                             .gradients = {dense_},
                             .push_rows = {&push, 1},
                             .min_versions = at,
                             .timeout = absl::Seconds(60),
                             .values = {dense_},
                             .pull_rows = {&pull, 1}},
                            &versions_, &responses));
  }

  EmbeddingTableStats TableStats(int shard) {
    absl::StatusOr<StatsResponse> stats = client_->Stats(shard);
    Check(stats);
    return stats->embeddings_size() > 0 ? stats->embeddings(0) : EmbeddingTableStats();
  }

  PsClient& client() { return *client_; }

 private:
  const int dim_;
  std::unique_ptr<PsClient> client_;
  std::vector<float> dense_, gradients_, values_;
  std::vector<int64_t> versions_;
};

std::unique_ptr<PsServerProcesses> StartShards(int shards, bool checkpoints) {
  absl::StatusOr<std::unique_ptr<PsServerProcesses>> processes = PsServerProcesses::Start(
      {.shards = shards, .workers = 1, .optimizer = kOptimizer, .checkpoints = checkpoints});
  Check(processes);
  return std::move(*processes);
}

// Pushes ids [first, first + count) once each, `batch` a push; calls
// `after_push` after each.
template <typename AfterPush>
void PushRange(TableClient& client, uint64_t first, int64_t count, int batch,
               AfterPush after_push) {
  std::vector<uint64_t> ids;
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min<int64_t>(batch, count - done);
    ids.resize(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = first + done + i;
    client.PushRows(ids);
    done += n;
    after_push(done);
  }
}

double Rate(int64_t count, absl::Duration elapsed) {
  return static_cast<double>(count) / absl::ToDoubleSeconds(elapsed);
}

int RunScale() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  const int shards = absl::GetFlag(FLAGS_shards);
  std::unique_ptr<PsServerProcesses> processes = StartShards(shards, false);
  // A shard's share is rows / shards give or take the hash's spread.
  const int64_t limit = std::min<int64_t>(rows / shards + rows / (4 * shards) + 1024, 1LL << 32);
  TableClient client(*processes, kDenseProbe, dim, limit);
  const int64_t rss_before = processes->ResidentBytes();
  const absl::Time fill_start = absl::Now();
  PushRange(client, 0, rows, absl::GetFlag(FLAGS_fill_batch), [](int64_t) {});
  const absl::Duration fill_time = absl::Now() - fill_start;
  const int64_t rss_after = processes->ResidentBytes();
  int64_t held = 0, table_bytes = 0;
  for (int s = 0; s < shards; ++s) {
    const EmbeddingTableStats stats = client.TableStats(s);
    held += stats.rows();
    table_bytes += stats.bytes();
  }
  if (held != rows) {
    ExitWithError(kProgram, absl::InternalError(absl::StrCat("the shards hold ", held,
                                                             " rows, not ", rows)));
  }
  // Timed steps over the filled table.
  const int batch = absl::GetFlag(FLAGS_batch_rows);
  std::mt19937_64 random(7);
  std::uniform_int_distribution<uint64_t> pick(0, static_cast<uint64_t>(rows) - 1);
  std::vector<std::vector<uint64_t>> batches(8);
  for (auto& b : batches) {
    absl::flat_hash_set<uint64_t> seen;
    while (static_cast<int>(b.size()) < batch) {
      const uint64_t id = pick(random);
      if (seen.insert(id).second) b.push_back(id);
    }
  }
  std::vector<double> steps_per_second;
  client.Step(batches[0], batches[1]);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const absl::Time start = absl::Now();
    const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
    int64_t steps = 0;
    while (absl::Now() < end) {
      client.Step(batches[steps % 8], batches[(steps + 1) % 8]);
      ++steps;
    }
    steps_per_second.push_back(Rate(steps, absl::Now() - start));
  }
  const double raw = 2.0 * dim * sizeof(float);
  const double rss_per_row = static_cast<double>(rss_after - rss_before) / rows;
  const double steps_median = Median(steps_per_second);
  const auto [low, high] = std::minmax_element(steps_per_second.begin(), steps_per_second.end());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"benchmark\":\"table_bench\",\"part\":\"scale\",\"rows\":%lld,\"dim\":%d,\"shards\":%d,"
        "\"optimizer\":\"adagrad\",\"fill_seconds\":%.2f,\"fill_rows_per_second\":%.0f,"
        "\"rss_before_bytes\":%lld,\"rss_after_bytes\":%lld,\"rss_bytes_per_row\":%.1f,"
        "\"table_bytes_per_row\":%.1f,\"raw_bytes_per_row\":%.0f,\"batch_rows\":%d,"
        "\"steps_per_second\":%.2f,\"steps_per_second_min\":%.2f,\"steps_per_second_max\":%.2f,"
        "\"rows_per_second\":%.0f,\"rows_per_second_min\":%.0f,\"rows_per_second_max\":%.0f,"
        "\"load\":%s}\n",
        static_cast<long long>(rows), dim, shards, absl::ToDoubleSeconds(fill_time),
        Rate(rows, fill_time), static_cast<long long>(rss_before),
        static_cast<long long>(rss_after), rss_per_row, static_cast<double>(table_bytes) / rows,
        raw, batch, steps_median, *low, *high, steps_median * batch, *low * batch, *high * batch,
        LoadAverage().c_str());
    return 0;
  }
  std::printf("fill: %lld rows x %d over %d shards in %.1f s (%.0f rows/s)\n",
              static_cast<long long>(rows), dim, shards, absl::ToDoubleSeconds(fill_time),
              Rate(rows, fill_time));
  std::printf("memory: shards' RSS %.1f MiB before, %.1f MiB after: %.1f B/row resident, "
              "%.1f B/row by the table's own count (Stats bytes), raw row + Adagrad state %.0f B "
              "(%.2fx)\n",
              rss_before / 1048576.0, rss_after / 1048576.0, rss_per_row,
              static_cast<double>(table_bytes) / rows, raw, rss_per_row / raw);
  std::printf("steps: %d rows pushed and %d pulled per step: %.1f steps/s (%.1f-%.1f), "
              "%.0f rows/s pushed = pulled (median of %zu rounds of %.0f s)\n",
              batch, batch, steps_median, *low, *high, steps_median * batch,
              steps_per_second.size(), absl::GetFlag(FLAGS_seconds));
  std::printf("load average: %s\n", LoadAverage().c_str());
  return 0;
}


int RunBound() {
  const int64_t sent = absl::GetFlag(FLAGS_rows);
  const int64_t limit = absl::GetFlag(FLAGS_max_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  std::unique_ptr<PsServerProcesses> processes = StartShards(1, false);
  // The bound of a table that refuses at its limit: every id past it is
  // counted as refused.
  TableClient client(*processes, kDenseProbe, dim, limit, EmbeddingTableConfig::REFUSE_NEW_ROWS);
  const int64_t rss_before = processes->ResidentBytes();
  // RSS after each push: the peak before the limit filled and after.
  int64_t rss_at_limit = 0, peak = rss_before;
  const absl::Time start = absl::Now();
  // Ids far from 0 and spread over the id space, each sent once.
  PushRange(client, uint64_t{1} << 40, sent, absl::GetFlag(FLAGS_fill_batch),
            [&](int64_t done) {
              const int64_t rss = processes->ResidentBytes();
              peak = std::max(peak, rss);
              if (done <= limit) rss_at_limit = peak;
            });
  const absl::Duration elapsed = absl::Now() - start;
  const EmbeddingTableStats stats = client.TableStats(0);
  const double raw = 2.0 * dim * sizeof(float);
  // What the limit implies: its rows at 1.5 times their raw bytes, and
  // the buffers of the pushes in flight (requests, staged rows, gRPC's).
  const double bound = 1.5 * raw * static_cast<double>(limit) + kPushBuffers;
  const double growth = static_cast<double>(peak - rss_before);
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"benchmark\":\"table_bench\",\"part\":\"bound\",\"ids_sent\":%lld,"
        "\"max_rows\":%lld,\"dim\":%d,"
        "\"optimizer\":\"adagrad\",\"seconds\":%.2f,\"rows\":%lld,\"rows_admitted\":%lld,"
        "\"rows_refused\":%lld,\"rss_before_bytes\":%lld,\"rss_at_limit_bytes\":%lld,"
        "\"rss_peak_bytes\":%lld,\"rss_growth_bytes\":%.0f,\"bound_bytes\":%.0f,"
        "\"table_bytes\":%lld,\"load\":%s}\n",
        static_cast<long long>(sent), static_cast<long long>(limit), dim,
        absl::ToDoubleSeconds(elapsed), static_cast<long long>(stats.rows()),
        static_cast<long long>(stats.rows_admitted()), static_cast<long long>(stats.rows_refused()),
        static_cast<long long>(rss_before), static_cast<long long>(rss_at_limit),
        static_cast<long long>(peak), growth, bound, static_cast<long long>(stats.bytes()),
        LoadAverage().c_str());
    return 0;
  }
  std::printf("sent %lld one-off ids (dim %d, Adagrad) in %.1f s to a shard holding at most %lld "
              "rows\n",
              static_cast<long long>(sent), dim, absl::ToDoubleSeconds(elapsed),
              static_cast<long long>(limit));
  std::printf("rows %lld, rows_admitted %lld, rows_refused %lld (sent - limit = %lld)\n",
              static_cast<long long>(stats.rows()), static_cast<long long>(stats.rows_admitted()),
              static_cast<long long>(stats.rows_refused()),
              static_cast<long long>(sent - std::min(sent, limit)));
  std::printf("shard RSS: %.1f MiB before, %.1f MiB when the limit filled, %.1f MiB peak over the "
              "run: grew %.1f MiB, %s the bound of %.1f MiB (the limit's rows at 1.5x raw + "
              "%.0f MiB of push buffers); the table's own count (Stats bytes) %.1f MiB\n",
              rss_before / 1048576.0, rss_at_limit / 1048576.0, peak / 1048576.0,
              growth / 1048576.0, growth <= bound ? "within" : "OVER", bound / 1048576.0,
              kPushBuffers / 1048576.0, stats.bytes() / 1048576.0);
  std::printf("load average: %s\n", LoadAverage().c_str());
  return 0;
}

// One variant's push latencies while an admin Checkpoint ran.
struct Stall {
  double longest_ms = 0;
  double median_ms = 0;
  double quiet_median_ms = 0;  // before the checkpoint
  // The longest push in a window as long as the checkpoint just before it
  // (at most the 500 ms of pushes before it): the shard's jitter without one.
  double quiet_longest_ms = 0;
  double capture_ms = 0;  // the shard's lock held for the capture (its Stats)
  double checkpoint_s = 0;
  double longest_at_s = 0;  // when the longest push started, from the checkpoint's start
  int pushes = 0;
  std::string file;  // the checkpoint's, as the shard named it (a delta's says so)
};

// Pushes of kStallPushRows rows of [0, 4096) back to back while the shard
// writes a checkpoint.
Stall MeasureStall(TableClient& client) {
  struct Push {
    absl::Time start, end;
  };
  std::vector<Push> pushes;
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::vector<uint64_t> ids(kStallPushRows);
    for (uint64_t n = 0; !stop.load(); ++n) {
      for (int i = 0; i < kStallPushRows; ++i) ids[i] = (n * kStallPushRows + i) % 4096;
      const absl::Time start = absl::Now();
      client.PushRows(ids);
      pushes.push_back({start, absl::Now()});
    }
  });
  absl::SleepFor(absl::Milliseconds(500));  // quiet pushes to compare with
  const absl::Time start = absl::Now();
  absl::StatusOr<CheckpointResponse> written = client.client().Checkpoint(0);
  Check(written);
  const absl::Time end = absl::Now();
  absl::StatusOr<StatsResponse> stats = client.client().Stats(0);
  Check(stats);
  absl::SleepFor(absl::Milliseconds(200));
  stop = true;
  pusher.join();
  Stall stall;
  stall.checkpoint_s = absl::ToDoubleSeconds(end - start);
  stall.file = written->path().substr(written->path().rfind('/') + 1);
  stall.capture_ms = stats->checkpoint().capture_micros() / 1000.0;
  std::vector<double> during, quiet;
  for (const Push& p : pushes) {
    const double ms = absl::ToDoubleMilliseconds(p.end - p.start);
    if (p.end > start && p.start < end) {
      if (during.empty() || ms > *std::max_element(during.begin(), during.end())) {
        stall.longest_at_s = absl::ToDoubleSeconds(p.start - start);
      }
      during.push_back(ms);
    } else if (p.end <= start) {
      quiet.push_back(ms);
      if (p.start >= start - (end - start)) {
        stall.quiet_longest_ms = std::max(stall.quiet_longest_ms, ms);
      }
    }
  }
  stall.pushes = static_cast<int>(during.size());
  if (!during.empty()) {
    stall.longest_ms = *std::max_element(during.begin(), during.end());
    stall.median_ms = Median(during);
  }
  if (!quiet.empty()) stall.quiet_median_ms = Median(quiet);
  return stall;
}

// The floats of the default job's dense variables (its model's kernels
// and biases).
int64_t DefaultModelFloats() {
  absl::StatusOr<JobConfig> config = ParseConfig(EmbeddedDefaultConfig(), "the default config");
  Check(config);
  ApplyDefaults(&*config);
  absl::StatusOr<std::vector<VariableSpec>> variables = ModelVariables(config->training());
  Check(variables);
  int64_t floats = 0;
  for (const VariableSpec& variable : *variables) floats += variable.size();
  return floats;
}

// The floats of `variant`'s dense variable: `rows` x `dim` for dense, the
// default model's for model, a probe's for the table variants.
int64_t StallDenseFloats(const std::string& variant, int64_t rows, int dim) {
  if (variant == "dense") return rows * dim;
  if (variant == "model") return DefaultModelFloats();
  return kDenseProbe;
}

// A fresh shard filled for `variant` (table, dense, delta or model), ready
// for the checkpoint MeasureStall times.
std::unique_ptr<PsServerProcesses> PrepareStall(const std::string& variant, int64_t rows, int dim,
                                                std::unique_ptr<TableClient>* client) {
  const bool delta = variant == "delta";
  absl::StatusOr<std::unique_ptr<PsServerProcesses>> started =
      PsServerProcesses::Start({.shards = 1,
                                .workers = 1,
                                .optimizer = kOptimizer,
                                .checkpoints = true,
                                .full_every = delta ? 1 << 30 : 0});
  Check(started);
  std::unique_ptr<PsServerProcesses> processes = std::move(*started);
  // The table variants hold `rows` rows; the dense ones a dense variable,
  // and only the rows the pushes touch.
  const bool dense = variant == "dense" || variant == "model";
  *client = std::make_unique<TableClient>(*processes, StallDenseFloats(variant, rows, dim), dim,
                                          rows + 1024);
  PushRange(**client, 0, dense ? 4096 : rows, absl::GetFlag(FLAGS_fill_batch), [](int64_t) {});
  if (delta) {
    // The chain's full checkpoint, then some training: rows spread over
    // the table, as a sample of ids would touch them.
    Check((*client)->client().Checkpoint(0));
    const int64_t trained = absl::GetFlag(FLAGS_delta_rows) > 0 ? absl::GetFlag(FLAGS_delta_rows)
                                                                : std::max<int64_t>(1, rows / 100);
    std::vector<uint64_t> ids;
    const int batch = absl::GetFlag(FLAGS_fill_batch);
    for (int64_t i = 0; i < trained; ++i) {
      ids.push_back(static_cast<uint64_t>((i * 7919) % rows));
      if (static_cast<int64_t>(ids.size()) == batch || i + 1 == trained) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        (*client)->PushRows(ids);
        ids.clear();
      }
    }
  }
  return processes;
}

int RunStall() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int dim = absl::GetFlag(FLAGS_dim);
  const bool json = absl::GetFlag(FLAGS_json);
  const std::vector<std::string> variants = absl::GetFlag(FLAGS_stall_variants);
  for (const std::string& variant : variants) {
    if (variant != "table" && variant != "dense" && variant != "delta" && variant != "model") {
      ExitWithError(kProgram, absl::InvalidArgumentError(absl::StrCat(
                                  "--stall_variants: table, dense, delta or model, not ", variant)));
    }
  }
  std::map<std::string, std::vector<Stall>> stalls_of;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const std::string& variant : variants) {
      std::unique_ptr<TableClient> client;
      std::unique_ptr<PsServerProcesses> processes = PrepareStall(variant, rows, dim, &client);
      const Stall stall = MeasureStall(*client);
      stalls_of[variant].push_back(stall);
      // Each round as it ends (on stderr beside JSON).
      std::fprintf(json ? stderr : stdout,
                   "round %d %-5s: checkpoint %.2f s, the shard's lock held %.2f ms for the "
                   "capture; %d pushes during it: longest %.1f ms (from %+.2f s), median %.1f "
                   "ms; before it: longest %.1f ms, median %.1f ms; %s; load %s\n",
                   round, variant.c_str(), stall.checkpoint_s, stall.capture_ms, stall.pushes,
                   stall.longest_ms, stall.longest_at_s, stall.median_ms, stall.quiet_longest_ms,
                   stall.quiet_median_ms, stall.file.c_str(), LoadAverage().c_str());
      std::fflush(json ? stderr : stdout);
      client.reset();  // before its shard goes
    }
  }
  for (const std::string& variant : variants) {
    const std::vector<Stall>& stalls = stalls_of[variant];
    auto figure = [&](double Stall::*field) {
      std::vector<double> values;
      for (const Stall& s : stalls) values.push_back(s.*field);
      const auto [low, high] = std::minmax_element(values.begin(), values.end());
      return std::array<double, 3>{Median(values), *low, *high};
    };
    const auto longest = figure(&Stall::longest_ms);
    const auto median = figure(&Stall::median_ms);
    const auto quiet = figure(&Stall::quiet_median_ms);
    const auto quiet_longest = figure(&Stall::quiet_longest_ms);
    const auto capture = figure(&Stall::capture_ms);
    const auto seconds = figure(&Stall::checkpoint_s);
    const bool dense = variant == "dense" || variant == "model";
    const int64_t dense_floats = dense ? StallDenseFloats(variant, rows, dim) : 0;
    if (json) {
      std::printf(
          "{\"benchmark\":\"table_bench\",\"part\":\"stall\",\"variant\":\"%s\","
          "\"rows\":%lld,\"dim\":%d,\"dense_floats\":%lld,"
          "\"optimizer\":\"adagrad\",\"push_rows\":%d,\"rounds\":%zu,"
          "\"longest_ms\":%.1f,\"longest_ms_min\":%.1f,\"longest_ms_max\":%.1f,"
          "\"median_ms\":%.2f,\"median_ms_min\":%.2f,\"median_ms_max\":%.2f,"
          "\"quiet_median_ms\":%.2f,\"quiet_median_ms_min\":%.2f,\"quiet_median_ms_max\":%.2f,"
          "\"quiet_longest_ms\":%.1f,\"quiet_longest_ms_min\":%.1f,\"quiet_longest_ms_max\":%.1f,"
          "\"capture_ms\":%.2f,\"capture_ms_min\":%.2f,\"capture_ms_max\":%.2f,"
          "\"checkpoint_s\":%.2f,\"checkpoint_s_min\":%.2f,\"checkpoint_s_max\":%.2f,"
          "\"load\":%s}\n",
          variant.c_str(), static_cast<long long>(rows), dim, static_cast<long long>(dense_floats),
          kStallPushRows, stalls.size(), longest[0], longest[1], longest[2], median[0], median[1],
          median[2], quiet[0], quiet[1], quiet[2], quiet_longest[0], quiet_longest[1],
          quiet_longest[2], capture[0], capture[1], capture[2], seconds[0], seconds[1], seconds[2],
          LoadAverage().c_str());
    } else {
      std::printf(
          "%s (%s): longest push during the checkpoint %.1f ms (%.1f-%.1f), median %.1f ms "
          "(%.1f-%.1f); before it: longest %.1f ms, median %.1f ms; the shard's lock held "
          "%.2f ms (%.2f-%.2f) for the capture; checkpoint %.2f s (%.2f-%.2f)\n",
          variant.c_str(),
          dense ? absl::StrCat(dense_floats, " floats").c_str()
                : absl::StrCat(rows, " rows x ", dim).c_str(),
          longest[0], longest[1], longest[2], median[0], median[1], median[2], quiet_longest[0],
          quiet[0], capture[0], capture[1], capture[2], seconds[0], seconds[1], seconds[2]);
    }
  }
  if (!json) std::printf("load average: %s\n", LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::SkipMutexDeadlockChecks();
  pst::ParseCommandLineFlags(argc, argv,
                             "One embedding table at scale: memory per row, a row limit's bound, "
                             "push latency during a checkpoint.",
                             pst::kBenchmark);
  spdlog::set_level(spdlog::level::warn);
  const std::string measure = absl::GetFlag(FLAGS_measure);
  if (measure == "scale") return pst::RunScale();
  if (measure == "bound") return pst::RunBound();
  if (measure == "stall") return pst::RunStall();
  pst::ExitWithError(pst::kProgram, absl::InvalidArgumentError("--measure: scale, bound or stall"));
}
