// rows_bench: embedding rows through PsClient's one-round-trip step, against
// ps_server processes on loopback (benchmarks/ps_server_processes.h).
//
// Each step is one PushPull: a small dense gradient, the row gradients of
// this step's unique ids, and the ids of the next step's batch, whose rows
// come back in the same exchange (worker/client/ps_client.h: StepRows). The
// batches (uniform ids from --id_space, unique per batch) are made before
// the timed loop. Variants (--transports x --batch_rows) alternate within
// each of --rounds rounds; a row's figures are the median (min-max) over
// the rounds. Rows/s counts the rows pushed per second, which equals the
// rows pulled.
//
//   rows_bench [--shards=2] [--batch_rows=1024,16384] [--dim=16]
//              [--transports=tcp,shm] [--wire=float32|bfloat16]
//              [--rounds=3] [--seconds=2] [--json]
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmarks/median.h"
#include "benchmarks/ps_server_processes.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/mutex_checks.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(int, shards, 2, "PS shards.");
ABSL_FLAG(std::string, batch_rows, "1024,16384", "Unique ids per step, comma-separated.");
ABSL_FLAG(int, dim, 16, "Embedding dim.");
ABSL_FLAG(int64_t, id_space, 10000000, "Ids are drawn uniformly from [0, id_space).");
ABSL_FLAG(std::string, transports, "tcp,shm", "tcp, shm or both, comma-separated.");
ABSL_FLAG(std::string, wire, "float32", "Wire dtype: float32, float16 or bfloat16.");
ABSL_FLAG(int, rounds, 3, "Rounds; each runs every variant once.");
ABSL_FLAG(double, seconds, 2.0, "Measuring time per variant per round.");
ABSL_FLAG(bool, json, false, "One JSON object per row instead of a table.");

namespace pst {
namespace {

constexpr char kProgram[] = "rows_bench";
constexpr int kBatches = 8;  // distinct batches, cycled

struct Variant {
  std::string transport;
  int batch_rows = 0;
  std::vector<double> rows_per_second;  // one per round
  std::vector<double> step_ms;
};

std::vector<std::vector<uint64_t>> MakeBatches(int rows, int64_t id_space, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<uint64_t> id(0, static_cast<uint64_t>(id_space) - 1);
  std::vector<std::vector<uint64_t>> batches(kBatches);
  for (std::vector<uint64_t>& batch : batches) {
    absl::flat_hash_set<uint64_t> seen;
    while (static_cast<int>(batch.size()) < rows) {
      const uint64_t next = id(random);
      if (seen.insert(next).second) batch.push_back(next);
    }
  }
  return batches;
}

class Worker {
 public:
  Worker(const std::vector<std::string>& addresses, const std::string& transport, DType wire,
         int dim) : dim_(dim) {
    absl::StatusOr<std::unique_ptr<PsClient>> client =
        PsClient::Connect(addresses, 0, absl::Seconds(30));
    if (!client.ok()) ExitWithError(kProgram, client.status());
    client_ = std::move(*client);
    client_->set_transport(transport == "shm" ? PsClient::Transport::kShm
                                              : PsClient::Transport::kTcp);
    client_->set_wire_dtype(wire);
    client_->SetVariables({{"dense", {256}}});
    EmbeddingTableConfig table;
    table.set_name("emb");
    table.set_dim(dim);
    client_->SetEmbeddingTables({table});
    dense_gradient_.assign(256, 0.0f);
    dense_values_.assign(256, 0.0f);
    versions_.assign(addresses.size(), 0);
    if (absl::Status s = client_->Register().status(); !s.ok()) ExitWithError(kProgram, s);
    const std::vector<float> zeros(256, 0.0f);
    if (absl::Status s = client_->Init({zeros}).status(); !s.ok()) ExitWithError(kProgram, s);
  }

  // One step: push `ids`' gradients, pull `next`'s rows.
  void Step(const std::vector<uint64_t>& ids, const std::vector<uint64_t>& next) {
    gradients_.assign(ids.size() * dim_, 0.001f);
    values_.resize(next.size() * dim_);
    RowGradients push{.table = 0, .ids = ids, .gradients = gradients_};
    RowValues pull{.table = 0, .ids = next, .values = values_};
    std::vector<PushResponse> responses;
    const std::vector<int64_t> at = versions_;
    absl::Status status = client_->Exchange({.computed_at = at,
                                             .gradients = {dense_gradient_},
                                             .push_rows = {&push, 1},
                                             .min_versions = at,
                                             .timeout = absl::Seconds(60),
                                             .values = {dense_values_},
                                             .pull_rows = {&pull, 1}},
                                            &versions_, &responses);
    if (!status.ok()) ExitWithError(kProgram, status);
  }

 private:
  int dim_;
  std::unique_ptr<PsClient> client_;
  std::vector<float> dense_gradient_, dense_values_, gradients_, values_;
  std::vector<int64_t> versions_;
};

int Run() {
  const int dim = absl::GetFlag(FLAGS_dim);
  DType wire = FLOAT32;
  if (!DType_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_wire)), &wire)) {
    ExitWithError(kProgram, absl::InvalidArgumentError("--wire: float32, float16 or bfloat16"));
  }
  std::vector<Variant> variants;
  for (absl::string_view transport : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',')) {
    for (absl::string_view rows : absl::StrSplit(absl::GetFlag(FLAGS_batch_rows), ',')) {
      Variant variant;
      variant.transport = std::string(transport);
      if (!absl::SimpleAtoi(rows, &variant.batch_rows) || variant.batch_rows < 1 ||
          (transport != "tcp" && transport != "shm")) {
        ExitWithError(kProgram, absl::InvalidArgumentError(
                                    "--batch_rows takes positive counts, --transports tcp,shm"));
      }
      variants.push_back(variant);
    }
  }
  absl::StatusOr<std::unique_ptr<PsServerProcesses>> shards =
      PsServerProcesses::Start(absl::GetFlag(FLAGS_shards), 1, int64_t{1} << 30);
  if (!shards.ok()) ExitWithError(kProgram, shards.status());
  const std::vector<std::string>& addresses = (*shards)->addresses();
  // One client per transport; a worker index serves one client at a time,
  // and the variants run one after another.
  Worker tcp(addresses, "tcp", wire, dim);
  Worker shm(addresses, "shm", wire, dim);
  const int64_t id_space = absl::GetFlag(FLAGS_id_space);
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (Variant& variant : variants) {
      Worker& worker = variant.transport == "shm" ? shm : tcp;
      const auto batches = MakeBatches(variant.batch_rows, id_space, round * 7919 + variant.batch_rows);
      worker.Step(batches[0], batches[1]);  // warm-up
      const absl::Time start = absl::Now();
      const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
      int64_t steps = 0;
      while (absl::Now() < end) {
        worker.Step(batches[steps % kBatches], batches[(steps + 1) % kBatches]);
        ++steps;
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      variant.rows_per_second.push_back(static_cast<double>(steps) * variant.batch_rows / seconds);
      variant.step_ms.push_back(1000.0 * seconds / static_cast<double>(steps));
    }
  }
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("%-9s %10s %4s %9s %12s %22s %10s\n", "transport", "rows/step", "dim", "wire",
                "step ms", "rows/s (min-max)", "MB/s each way");
  }
  const std::string wire_name = DType_Name(wire);
  for (const Variant& v : variants) {
    const double rate = Median(v.rows_per_second);
    const double low = *std::min_element(v.rows_per_second.begin(), v.rows_per_second.end());
    const double high = *std::max_element(v.rows_per_second.begin(), v.rows_per_second.end());
    const double mb = rate * dim * DTypeBytes(wire) / 1e6;
    if (json) {
      std::printf("{\"transport\":\"%s\",\"batch_rows\":%d,\"dim\":%d,\"wire\":\"%s\","
                  "\"shards\":%d,\"step_ms\":%.3f,\"rows_per_second\":%.0f,"
                  "\"rows_per_second_min\":%.0f,\"rows_per_second_max\":%.0f}\n",
                  v.transport.c_str(), v.batch_rows, dim, wire_name.c_str(),
                  absl::GetFlag(FLAGS_shards), Median(v.step_ms), rate, low, high);
    } else {
      std::printf("%-9s %10d %4d %9s %12.3f %10.0f (%.0f-%.0f) %10.1f\n", v.transport.c_str(),
                  v.batch_rows, dim, wire_name.c_str(), Median(v.step_ms), rate, low, high, mb);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  pst::SkipMutexDeadlockChecks();
  pst::ParseCommandLineFlags(argc, argv,
                             "Embedding rows through PsClient's step exchange, against ps_server "
                             "processes on loopback.",
                             pst::kBenchmark);
  spdlog::set_level(spdlog::level::warn);
  return pst::Run();
}
