// row_step_bench: one shard's SYNC step of embedding rows, in process: the
// shard's own row work without RPCs, processes or other shards, so that a
// change to the row store or the row-wise optimizers shows above the noise
// a loaded host puts on the whole job.
//
// The tables are a CTR model's (ps_server/core/embedding_table.h): one per
// --dims entry, every one fed the same ids, as the CTR model's deep and
// wide tables are, Adagrad. A batch is --batch examples of --fields
// categorical fields, each value drawn log-uniformly from --distinct ids
// of its field (a Zipf-like skew: a few ids in most batches, most ids
// rare), its unique ids the rank's rows. A step: every rank's push checked
// and landed, the rank-ordered mean staged, committed, then each rank's
// pull of its next batch's rows answered. --warm_steps grow the table
// first; the next --steps are timed, per phase. Each of --rounds rounds
// starts from an empty table; a figure is the median over the rounds of
// each round's median step (min-max over the rounds).
//
// --memory_bytes and --disk give every table a RAM budget and a disk tier
// (TableStorage), to measure the tiers' cost.
//
//   row_step_bench [--ranks=2] [--batch=256] [--fields=26] [--distinct=100000]
//                  [--dims=8,1] [--warm_steps=400] [--steps=200] [--rounds=3] [--json]
//                  [--memory_bytes=N --disk=DIR]
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmarks/median.h"
#include "benchmarks/process_cpu.h"
#include "common/exit.h"
#include "common/flags.h"
#include "ps_server/core/embedding_table.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, ranks, 2, "SYNC workers whose rows each step sums.");
ABSL_FLAG(int, batch, 256, "Examples per rank and step.");
ABSL_FLAG(int, fields, 26, "Categorical fields per example.");
ABSL_FLAG(int64_t, distinct, 100000, "Distinct ids per field.");
ABSL_FLAG(std::string, dims, "8,1", "One table per dim, comma-separated; all fed the same ids.");
ABSL_FLAG(int, warm_steps, 400, "Untimed steps that grow the table first.");
ABSL_FLAG(int, steps, 200, "Timed steps per round.");
ABSL_FLAG(int, rounds, 3, "Rounds, each from an empty table.");
ABSL_FLAG(bool, json, false, "One JSON row instead of text.");
ABSL_FLAG(int64_t, memory_bytes, 0,
          "Each table's storage.memory_bytes (0: no budget); with --disk, its RAM tier.");
ABSL_FLAG(std::string, disk, "",
          "Each table's storage.disk: a directory for its disk tier (empty: RAM only).");
ABSL_FLAG(int64_t, prefetch_rows, pst::EmbeddingTableOptions::kDefaultPrefetchRows,
          "With --disk: rows each table reads ahead at most (0: none). Each step's pulls are "
          "handed to Prefetch as their exchanges arrive, before the step's pushes land.");
ABSL_FLAG(int, worker_us, 0,
          "Untimed microseconds between steps: the workers' forward and backward passes, "
          "while the shard reads the next step's cold rows ahead.");

namespace pst {
namespace {

constexpr char kProgram[] = "row_step_bench";
constexpr uint64_t kSeed = 1;

std::vector<int> Dims() {
  std::vector<int> dims;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_dims), ',')) {
    int dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim <= 0) {
      ExitWithError(kProgram, absl::InvalidArgumentError(
                                   "--dims: positive integers, comma-separated (e.g. 8,1)"));
    }
    dims.push_back(dim);
  }
  return dims;
}

std::string TableName(size_t t) { return absl::StrCat("t", t); }

// One rank's unique ids of one batch.
std::vector<uint64_t> Batch(std::mt19937_64& rng) {
  const int fields = absl::GetFlag(FLAGS_fields);
  const double distinct = static_cast<double>(absl::GetFlag(FLAGS_distinct));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  absl::flat_hash_set<uint64_t> seen;
  std::vector<uint64_t> ids;
  for (int e = 0; e < absl::GetFlag(FLAGS_batch); ++e) {
    for (int f = 0; f < fields; ++f) {
      const auto value = static_cast<uint64_t>(std::pow(distinct, uniform(rng)));
      const uint64_t id = (static_cast<uint64_t>(f) << 40) | value;
      if (seen.insert(id).second) ids.push_back(id);
    }
  }
  return ids;
}

std::string IdBytes(const std::vector<uint64_t>& ids) {
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t));
}

PushRequest PushOf(int rank, const std::vector<uint64_t>& ids, const std::vector<int>& dims) {
  PushRequest push;
  push.set_worker(rank);
  for (size_t t = 0; t < dims.size(); ++t) {
    EmbeddingRows* rows = push.add_rows();
    rows->set_table(TableName(t));
    rows->set_dtype(FLOAT32);
    rows->set_ids(IdBytes(ids));
    // A gradient per element, distinct per id, of the size a CTR batch's sums have.
    std::vector<float> gradients(ids.size() * dims[t]);
    for (size_t i = 0; i < gradients.size(); ++i) {
      gradients[i] = 0.01f * static_cast<float>(static_cast<int>((ids[i / dims[t]] + i) % 7) - 3);
    }
    rows->set_data(std::string(reinterpret_cast<const char*>(gradients.data()),
                               gradients.size() * sizeof(float)));
  }
  return push;
}

PullRequest PullOf(int rank, const std::vector<uint64_t>& ids, size_t tables) {
  PullRequest pull;
  pull.set_worker(rank);
  for (size_t t = 0; t < tables; ++t) {
    EmbeddingRows* rows = pull.add_rows();
    rows->set_table(TableName(t));
    rows->set_ids(IdBytes(ids));
  }
  return pull;
}

std::unique_ptr<EmbeddingTable> MakeTable(const std::vector<int>& dims, int ranks) {
  EmbeddingTableOptions options;
  options.num_workers = ranks;
  options.seed = kSeed;
  options.optimizer.mutable_adagrad()->set_learning_rate(0.1f);
  options.optimizer.mutable_adagrad()->set_initial_accumulator(1e-4f);
  options.prefetch_rows = absl::GetFlag(FLAGS_prefetch_rows);
  auto table = std::make_unique<EmbeddingTable>(options);
  InitRequest init;
  for (size_t t = 0; t < dims.size(); ++t) {
    EmbeddingTableConfig* spec = init.add_embeddings();
    spec->set_name(TableName(t));
    spec->set_dim(dims[t]);
    spec->set_init_scale(0.05f);
    spec->mutable_storage()->set_memory_bytes(absl::GetFlag(FLAGS_memory_bytes));
    spec->mutable_storage()->set_disk(absl::GetFlag(FLAGS_disk));
  }
  if (absl::Status s = table->Initialize(init); !s.ok()) ExitWithError(kProgram, s);
  return table;
}

// Per phase, microseconds of one step.
struct Phases {
  double land = 0;    // every rank's push checked and landed
  double stage = 0;   // the rank-ordered mean, staged
  double commit = 0;
  double answer = 0;  // every rank's next rows answered
  double step() const { return land + stage + commit + answer; }
};

struct Round {
  Phases median;
  double ids_per_step = 0;  // unique ids over the ranks, per table
  double rows_held = 0;     // the first table's rows at the end
  // The first table's reads that missed RAM, per timed step: all, and
  // those that waited for the disk (the rest were read ahead in time, or
  // were of ids the disk never stored).
  double disk_reads = 0;
  double disk_waits = 0;
  // The process's CPU time (every thread: the disk tier's reader and
  // RocksDB's flushes and compactions too) per timed step, which a busy
  // host disturbs less than the wall time.
  double cpu_us = 0;
};

Round RunRound(int round) {
  const std::vector<int> dims = Dims();
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int warm = absl::GetFlag(FLAGS_warm_steps);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::unique_ptr<EmbeddingTable> table = MakeTable(dims, ranks);
  std::mt19937_64 rng(kSeed + round);
  // Every batch made before the loop: the step's own work is timed.
  std::vector<std::vector<PushRequest>> pushes(warm + steps);
  std::vector<std::vector<PullRequest>> pulls(warm + steps);
  std::vector<std::vector<uint64_t>> next(ranks);
  for (int r = 0; r < ranks; ++r) next[r] = Batch(rng);
  double ids = 0;
  for (int s = 0; s < warm + steps; ++s) {
    absl::flat_hash_set<uint64_t> step_ids;
    for (int r = 0; r < ranks; ++r) {
      pushes[s].push_back(PushOf(r, next[r], dims));
      step_ids.insert(next[r].begin(), next[r].end());
      next[r] = Batch(rng);
      pulls[s].push_back(PullOf(r, next[r], dims.size()));
    }
    if (s >= warm) ids += static_cast<double>(step_ids.size());
  }
  std::array<std::vector<double>, 4> timed;
  const absl::Duration worker_time = absl::Microseconds(absl::GetFlag(FLAGS_worker_us));
  StatsResponse at_warm;
  double cpu_at_warm = 0;
  for (int s = 0; s < warm + steps; ++s) {
    if (s == warm) {
      table->AddStats(&at_warm);
      cpu_at_warm = ProcessCpuSeconds(getpid());
    }
    if (worker_time > absl::ZeroDuration()) absl::SleepFor(worker_time);
    const absl::Time start = absl::Now();
    // Each rank's exchange carries its push and its pull of the next
    // step's rows; the shard reads the pull's cold rows ahead at once.
    for (int r = 0; r < ranks; ++r) table->Prefetch(pulls[s][r]);
    for (int r = 0; r < ranks; ++r) {
      TablePush plan;
      if (absl::Status c = table->CheckPush(pushes[s][r], false, true, &plan); !c.ok()) {
        ExitWithError(kProgram, c);
      }
      table->Land(r, pushes[s][r], plan);
    }
    const absl::Time landed = absl::Now();
    if (absl::Status staged = table->StageStep({}); !staged.ok()) ExitWithError(kProgram, staged);
    const absl::Time staged = absl::Now();
    table->Commit();
    const absl::Time committed = absl::Now();
    for (int r = 0; r < ranks; ++r) {
      PullResponse answer;
      if (absl::Status a = table->AnswerPull(pulls[s][r], &answer); !a.ok()) {
        ExitWithError(kProgram, a);
      }
    }
    const absl::Time answered = absl::Now();
    if (s < warm) continue;
    timed[0].push_back(absl::ToDoubleMicroseconds(landed - start));
    timed[1].push_back(absl::ToDoubleMicroseconds(staged - landed));
    timed[2].push_back(absl::ToDoubleMicroseconds(committed - staged));
    timed[3].push_back(absl::ToDoubleMicroseconds(answered - committed));
  }
  const double cpu = ProcessCpuSeconds(getpid()) - cpu_at_warm;
  StatsResponse stats;
  table->AddStats(&stats);
  Round result;
  result.cpu_us = cpu * 1e6 / steps;
  result.median = {Median(timed[0]), Median(timed[1]), Median(timed[2]), Median(timed[3])};
  result.ids_per_step = ids / steps;
  result.rows_held = stats.embeddings_size() > 0 ? stats.embeddings(0).rows() : 0;
  if (stats.embeddings_size() > 0) {
    const EmbeddingTableStats& end = stats.embeddings(0);
    const EmbeddingTableStats& start = at_warm.embeddings(0);
    result.disk_reads = static_cast<double>(end.disk_reads() - start.disk_reads()) / steps;
    result.disk_waits = static_cast<double>(end.disk_waits() - start.disk_waits()) / steps;
  }
  return result;
}

int Run() {
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const bool json = absl::GetFlag(FLAGS_json);
  std::vector<Round> results;
  for (int round = 0; round < rounds; ++round) {
    results.push_back(RunRound(round));
    const Round& r = results.back();
    std::fprintf(json ? stderr : stdout,
                 "round %d: %.0f ids a step, %.0f rows held; land %.0f us, stage %.0f us, "
                 "commit %.0f us, answer %.0f us, step %.0f us, CPU %.0f us a step; disk reads "
                 "%.0f a step, %.0f of them waited\n",
                 round, r.ids_per_step, r.rows_held, r.median.land, r.median.stage, r.median.commit,
                 r.median.answer, r.median.step(), r.cpu_us, r.disk_reads, r.disk_waits);
    std::fflush(json ? stderr : stdout);
  }
  auto figure = [&](auto value) {
    std::vector<double> values;
    for (const Round& r : results) values.push_back(value(r));
    const auto [low, high] = std::minmax_element(values.begin(), values.end());
    return std::array<double, 3>{Median(values), *low, *high};
  };
  const auto land = figure([](const Round& r) { return r.median.land; });
  const auto stage = figure([](const Round& r) { return r.median.stage; });
  const auto commit = figure([](const Round& r) { return r.median.commit; });
  const auto answer = figure([](const Round& r) { return r.median.answer; });
  const auto step = figure([](const Round& r) { return r.median.step(); });
  const auto ids = figure([](const Round& r) { return r.ids_per_step; });
  const auto held = figure([](const Round& r) { return r.rows_held; });
  const auto reads = figure([](const Round& r) { return r.disk_reads; });
  const auto waits = figure([](const Round& r) { return r.disk_waits; });
  const auto cpu = figure([](const Round& r) { return r.cpu_us; });
  const size_t tables = Dims().size();
  // Rows updated a second: every table's staged rows over the step.
  const double rows_per_second = ids[0] * static_cast<double>(tables) / (step[0] * 1e-6);
  if (json) {
    std::printf(
        "{\"benchmark\":\"row_step_bench\",\"ranks\":%d,\"batch\":%d,\"fields\":%d,"
        "\"distinct\":%lld,\"dims\":\"%s\",\"optimizer\":\"adagrad\",\"rounds\":%d,"
        "\"ids_per_step\":%.0f,\"rows_held\":%.0f,"
        "\"land_us\":%.0f,\"land_us_min\":%.0f,\"land_us_max\":%.0f,"
        "\"stage_us\":%.0f,\"stage_us_min\":%.0f,\"stage_us_max\":%.0f,"
        "\"commit_us\":%.0f,\"commit_us_min\":%.0f,\"commit_us_max\":%.0f,"
        "\"answer_us\":%.0f,\"answer_us_min\":%.0f,\"answer_us_max\":%.0f,"
        "\"step_us\":%.0f,\"step_us_min\":%.0f,\"step_us_max\":%.0f,"
        "\"rows_per_second\":%.0f,\"memory_bytes\":%lld,\"prefetch_rows\":%lld,"
        "\"worker_us\":%d,\"disk_reads\":%.0f,\"disk_waits\":%.0f,\"cpu_us\":%.0f,"
        "\"load\":%s}\n",
        absl::GetFlag(FLAGS_ranks), absl::GetFlag(FLAGS_batch), absl::GetFlag(FLAGS_fields),
        static_cast<long long>(absl::GetFlag(FLAGS_distinct)), absl::GetFlag(FLAGS_dims).c_str(),
        rounds, ids[0], held[0], land[0], land[1], land[2], stage[0], stage[1], stage[2], commit[0],
        commit[1], commit[2], answer[0], answer[1], answer[2], step[0], step[1], step[2],
        rows_per_second, static_cast<long long>(absl::GetFlag(FLAGS_memory_bytes)),
        static_cast<long long>(
            absl::GetFlag(FLAGS_disk).empty() ? 0 : absl::GetFlag(FLAGS_prefetch_rows)),
        absl::GetFlag(FLAGS_worker_us), reads[0], waits[0], cpu[0], LoadAverage().c_str());
  } else {
    std::printf(
        "step %.0f us (%.0f-%.0f): land %.0f, stage %.0f, commit %.0f, answer %.0f us; "
        "CPU %.0f us a step; %.0f ids a step per table, %.0f rows updated a second\n",
        step[0], step[1], step[2], land[0], stage[0], commit[0], answer[0], cpu[0], ids[0],
        rows_per_second);
  }
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::ParseCommandLineFlags(argc, argv,
                             "One shard's SYNC step of embedding rows, in process: check and "
                             "land, stage, commit, answer.",
                             pst::kBenchmark);
  spdlog::set_level(spdlog::level::warn);
  if (absl::GetFlag(FLAGS_ranks) < 1 || absl::GetFlag(FLAGS_batch) < 1 ||
      absl::GetFlag(FLAGS_fields) < 1 || absl::GetFlag(FLAGS_distinct) < 2 ||
      absl::GetFlag(FLAGS_steps) < 1 || absl::GetFlag(FLAGS_rounds) < 1 ||
      absl::GetFlag(FLAGS_warm_steps) < 0) {
    pst::ExitWithError(pst::kProgram,
                       absl::InvalidArgumentError(
                           "--ranks, --batch, --fields, --steps and --rounds must be at least 1, "
                           "--distinct at least 2, --warm_steps at least 0"));
  }
  return pst::Run();
}
