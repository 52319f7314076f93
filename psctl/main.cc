// psctl: look at and steer a running cluster.
//   psctl status     --config=FILE   every shard and worker at a glance
//   psctl checkpoint --config=FILE   every shard writes a checkpoint now
//   psctl shutdown   --config=FILE   every shard stops cleanly
//   psctl token      --config=FILE --task=worker:N   that worker's own token
//   psctl plan       --config=FILE --link=25gbit --rtt=100us --worker_step_ms=5
//                    predicted step time and samples/s for K = 1..16 shards
//   psctl export     --checkpoint=DIR --format=npz|pt [--out=FILE]
//                    the trained model out of a job's checkpoints
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/security.h"
#include "common/tensor_codec.h"
#include "psctl/model_export.h"
#include "psctl/plan.h"
#include "psctl/table_report.h"
#include "spdlog/spdlog.h"
#include "worker/client/ps_client.h"

// An override this program reads itself (common/overrides.cc).
ABSL_DECLARE_FLAG(int, connect_timeout_seconds);
ABSL_FLAG(std::string, task, "", "For psctl token: the task, worker:<index>.");
ABSL_FLAG(std::string, link, "", "For psctl plan: each port's rate each way, e.g. 25gbit.");
ABSL_FLAG(std::string, rtt, "0us", "For psctl plan: the round trip between two hosts, e.g. 100us.");
ABSL_FLAG(double, worker_step_ms, -1,
          "For psctl plan: one worker's step without its exchange (compute), in ms, e.g. from a "
          "short local run.");
ABSL_FLAG(int, ids_per_batch, 0,
          "For psctl plan: distinct ids one worker's batch looks up per embedding table "
          "(0: the batch size).");
ABSL_FLAG(int, max_shards, 16, "For psctl plan: the most shards to consider.");
ABSL_FLAG(std::string, checkpoint, "",
          "For psctl export: the job's training.checkpoint.dir (holding shard-<i>/).");
ABSL_FLAG(std::string, format, "npz", "For psctl export: npz (numpy) or pt (torch.load).");
ABSL_FLAG(std::string, out, "", "For psctl export: the file to write (default: model.<format>).");

namespace pst {
namespace {

constexpr char kProgram[] = "psctl";

// Every shard in the config, each at any of its replicas (the calls find
// the primary); connects as worker 0, which only names the caller in the
// shard's logs (admin calls do not count as a worker's).
std::unique_ptr<PsClient> Connect(const JobConfig& config) {
  absl::StatusOr<ClusterSecurity> security =
      ClusterSecurity::FromConfig(config.cluster(), ClusterSecurity::Role::kClient);
  if (!security.ok()) ExitWithError(kProgram, security.status());
  std::vector<std::string> addresses(config.cluster().ps().begin(), config.cluster().ps().end());
  const int seconds = absl::GetFlag(FLAGS_connect_timeout_seconds);
  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect(addresses, 0, absl::Seconds(seconds > 0 ? seconds : 5), *security,
                        ShardBackups(config.cluster()));
  if (!client.ok()) ExitWithError(kProgram, client.status());
  return std::move(*client);
}

int Status(const JobConfig& config) {
  std::unique_ptr<PsClient> client = Connect(config);
  std::vector<StatsResponse> shards;
  std::vector<std::string> addresses(client->num_shards());
  for (int s = 0; s < client->num_shards(); ++s) {
    absl::StatusOr<StatsResponse> stats = client->Stats(s, &addresses[s]);
    if (!stats.ok()) ExitWithError(kProgram, stats.status());
    shards.push_back(*stats);
  }
  std::printf("cluster: %d shard(s), %d worker(s), %s mode\n\n", client->num_shards(),
              config.cluster().workers(), ModeName(shards[0].mode()).c_str());
  std::printf("%-6s %-22s %9s %9s %12s %9s %9s %9s %6s\n", "shard", "address", "version",
              "variables", "bytes", "applied", "dropped", "rejected", "live");
  for (int s = 0; s < client->num_shards(); ++s) {
    const StatsResponse& st = shards[s];
    std::printf(
        "%-6s %-22s %9lld %9d %12lld %9lld %9lld %9lld %3d/%-2d\n", absl::StrCat("ps:", s).c_str(),
        addresses[s].c_str(), static_cast<long long>(st.version()), st.variables(),
        static_cast<long long>(st.parameter_bytes()), static_cast<long long>(st.pushes_applied()),
        static_cast<long long>(st.pushes_dropped()), static_cast<long long>(st.pushes_rejected()),
        st.live_workers(), st.workers_size());
  }
  if (const std::string tables = EmbeddingTableReport(shards); !tables.empty()) {
    std::printf("\n%s", tables.c_str());
  }
  if (const std::string tiers = TableTierReport(shards); !tiers.empty()) {
    std::printf("\ntiers\n%s", tiers.c_str());
  }
  if (const std::string replicas = ReplicationReport(shards); !replicas.empty()) {
    std::printf("\nreplicas\n%s", replicas.c_str());
  }
  std::printf("\nrefused\n%s", RefusalReport(shards).c_str());
  if (!config.training().checkpoint().dir().empty()) {
    std::printf("\n%-6s %11s %8s %8s %9s %10s %s\n", "shard", "checkpoint", "written", "failed",
                "in_a_row", "capture_ms", "last_error");
    for (int s = 0; s < client->num_shards(); ++s) {
      const CheckpointStats& c = shards[s].checkpoint();
      std::printf("%-6s %11s %8lld %8lld %9d %10.2f %s\n", absl::StrCat("ps:", s).c_str(),
                  c.version() < 0 ? "none" : absl::StrCat(c.version()).c_str(),
                  static_cast<long long>(c.written()), static_cast<long long>(c.failures()),
                  c.consecutive_failures(), c.capture_micros() / 1000.0,
                  c.last_error().empty() ? "-" : c.last_error().c_str());
    }
  }
  // Workers as shard 0 sees them; lag is how many versions behind shard 0's
  // current version the worker's last gradient was computed.
  std::printf("\n%-10s %10s %8s %6s %10s %8s %10s %s\n", "worker", "last_step", "clock", "lag",
              "last_seen", "dropped", "staleness", "state");
  const StatsResponse& first = shards[0];
  for (const WorkerStats& w : first.workers()) {
    std::string seen = w.seconds_since_seen() < 0 ? "never"
                                                   : absl::StrFormat("%.1fs ago", w.seconds_since_seen());
    std::string state = w.done()                     ? "done"
                        : w.live()                   ? "live"
                        : w.seconds_since_seen() < 0 ? "not heard from yet"
                                                     : "DEAD (lease expired)";
    std::printf("%-10s %10lld %8lld %6lld %10s %8lld %10lld %s\n",
                absl::StrCat("worker:", w.worker()).c_str(), static_cast<long long>(w.last_step()),
                static_cast<long long>(w.clock()),
                static_cast<long long>(w.last_step() < 0 ? 0 : first.version() - w.last_step()),
                seen.c_str(), static_cast<long long>(w.dropped()),
                static_cast<long long>(w.last_staleness()), state.c_str());
  }
  if (first.mode() == SSP) {
    std::printf("\nSSP clock spread (fastest - slowest worker SSP waits for): %lld\n",
                static_cast<long long>(first.clock_spread()));
  }
  return 0;
}

int Checkpoint(const JobConfig& config) {
  std::unique_ptr<PsClient> client = Connect(config);
  for (int s = 0; s < client->num_shards(); ++s) {
    absl::StatusOr<CheckpointResponse> done = client->Checkpoint(s);
    if (!done.ok()) ExitWithError(kProgram, done.status());
    std::printf("ps:%d: checkpoint at version %lld: %s\n", s,
                static_cast<long long>(done->version()), done->path().c_str());
  }
  return 0;
}

int Shutdown(const JobConfig& config) {
  std::unique_ptr<PsClient> client = Connect(config);
  for (int s = 0; s < client->num_shards(); ++s) {
    if (absl::Status status = client->Shutdown(s); !status.ok()) ExitWithError(kProgram, status);
    std::printf("ps:%d: shutting down\n", s);
  }
  return 0;
}

// Prints the task token of --task (common/security.h), made from the
// cluster token the config names: what that worker carries in
// PSTRAIN_TASK_TOKEN where it is started by hand or by a scheduler.
int Token(const JobConfig& config) {
  if (!config.cluster().has_auth()) {
    ExitWithError(kProgram, absl::InvalidArgumentError(
                                "the config has no cluster.auth: there is no token to derive from"));
  }
  absl::StatusOr<TaskId> task = ParseTask(absl::GetFlag(FLAGS_task));
  if (!task.ok()) ExitWithError(kProgram, task.status());
  if (task->kind != TaskId::Kind::kWorker) {
    ExitWithError(kProgram, absl::InvalidArgumentError(
                                "--task must be worker:<index>: only workers carry a task token"));
  }
  if (absl::Status s = ValidateTask(config, *task); !s.ok()) ExitWithError(kProgram, s);
  absl::StatusOr<std::string> cluster_token = ReadClusterToken(config.cluster());
  if (!cluster_token.ok()) ExitWithError(kProgram, cluster_token.status());
  std::printf("%s\n", TaskToken(*cluster_token, task->ToString()).c_str());
  return 0;
}

// Predicted step time and samples/s per number of shards (psctl/plan.h).
int PlanCluster(const JobConfig& config) {
  const std::string link = absl::GetFlag(FLAGS_link);
  if (link.empty()) {
    ExitWithError(kProgram, absl::InvalidArgumentError(
                                "psctl plan: give --link, each port's rate, e.g. --link=25gbit"));
  }
  absl::StatusOr<double> link_bytes = ParseLinkBytesPerSecond(link);
  if (!link_bytes.ok()) ExitWithError(kProgram, link_bytes.status());
  absl::StatusOr<double> rtt = ParseSeconds(absl::GetFlag(FLAGS_rtt));
  if (!rtt.ok()) ExitWithError(kProgram, rtt.status());
  const double step_ms = absl::GetFlag(FLAGS_worker_step_ms);
  if (step_ms < 0) {
    ExitWithError(kProgram, absl::InvalidArgumentError(
                                "psctl plan: give --worker_step_ms, one worker's compute per step "
                                "in ms (e.g. from a short local run of the job)"));
  }
  const int max_shards = absl::GetFlag(FLAGS_max_shards);
  if (max_shards < 1 || max_shards > 4096) {
    ExitWithError(kProgram, absl::InvalidArgumentError("--max_shards: give 1 to 4096"));
  }
  const TrainingConfig& training = config.training();
  absl::StatusOr<std::vector<VariableSpec>> dense = ModelVariables(training);
  if (!dense.ok()) ExitWithError(kProgram, dense.status());
  const int wire_bytes = DTypeBytes(WireDType(training.wire_dtype()));
  int64_t parameters = 0;
  for (const VariableSpec& v : *dense) parameters += v.size();
  const int batch = std::max(1, training.batch_size());
  const int ids = absl::GetFlag(FLAGS_ids_per_batch) > 0 ? absl::GetFlag(FLAGS_ids_per_batch) : batch;
  double embedding_bytes = 0;  // each way: the ids (8 bytes) and a row of dim values each
  for (const EmbeddingTableConfig& table : training.model().embeddings()) {
    embedding_bytes += static_cast<double>(ids) * (8.0 + table.dim() * wire_bytes);
  }
  PlanJob job;
  job.workers = std::max(1, config.cluster().workers());
  job.mode = training.mode() == SYNC ? SYNC : ASYNC;
  job.batch_size = batch;
  job.dense_wire_bytes = static_cast<double>(parameters) * wire_bytes;
  job.embedding_wire_bytes = embedding_bytes;
  job.link_bytes_per_s = *link_bytes;
  job.rtt_s = *rtt;
  job.compute_s = step_ms / 1e3;
  const CostConstants c = FittedConstants();
  const std::vector<PlanRow> rows = Plan(c, job, *dense, max_shards);
  if (rows.empty()) {
    ExitWithError(kProgram, absl::InvalidArgumentError(
                                "psctl plan: the model is too small for even one shard count"));
  }
  std::printf("plan: %d worker(s), %s, batch %d, %lld dense parameters + %d embedding table(s) "
              "(%.3g MB each way per worker per step at %s), %s links, rtt %s, compute %.3f ms\n",
              job.workers, ModeName(job.mode).c_str(), batch, static_cast<long long>(parameters),
              training.model().embeddings_size(),
              (job.dense_wire_bytes + job.embedding_wire_bytes) / 1e6,
              absl::AsciiStrToLower(WireDtype_Name(training.wire_dtype())).c_str(), link.c_str(),
              absl::GetFlag(FLAGS_rtt).c_str(), step_ms);
  std::printf("%6s %12s %14s %15s\n", "shards", "step_ms", "samples/s", "busiest_share");
  for (const PlanRow& r : rows) {
    std::printf("%6d %12.3f %14.0f %15.3f\n", r.shards, r.step_s * 1e3, r.samples_per_s,
                r.shard_share);
  }
  const int useful = UsefulShards(job);
  const PlanRow* best = &rows[0];
  for (const PlanRow& r : rows) {
    if (r.shards <= useful && r.samples_per_s > best->samples_per_s) best = &r;
  }
  const PlanRow& pick = Recommend(rows, 0.05, useful);
  std::printf("recommended: %d shard(s), %.0f samples/s (the smallest K within 5%% of the best, "
              "K=%d at %.0f samples/s, of the K up to %d, one per worker: past it a shard's port "
              "carries less than a worker's own)\n",
              pick.shards, pick.samples_per_s, best->shards, best->samples_per_s, useful);
  std::printf("assumptions: each task on its own port of --link each way through one "
              "non-blocking switch, M bytes each way per worker, the busiest shard f of them; "
              "step = compute + %.3g ms + %.3g ms x K + rtt + SYNC: 2 max(M, NfM)/(%.2f B) + "
              "%.2f min(M, K MiB)/B + %.3g ns/byte x NfM (ASYNC: the larger of compute + "
              "messages + M/(%.2f B) + the same fill and 2NfM/(%.2f B) + the same CPU); "
              "constants fitted on shaped links of one host (docs/benchmarks.md)\n",
              c.alpha_s * 1e3, c.beta_s * 1e3, c.eta_y, c.fill, c.gamma_s_per_byte * 1e9, c.eta_w,
              c.eta_s);
  return 0;
}


// The npz at `npz` as a dict of tensors torch.load reads, at `out`; python3
// with numpy and torch converts it ($PSTRAIN_PYTHON, else /usr/bin/python3
// where it exists, else python3 on the PATH).
constexpr char kToTorch[] =
    "import sys\n"
    "try:\n"
    "    import numpy, torch\n"
    "except ImportError as e:\n"
    "    sys.exit(3)\n"
    "with numpy.load(sys.argv[1]) as z:\n"
    "    torch.save({k: torch.from_numpy(z[k].copy()) for k in z.files}, sys.argv[2])\n";

std::string Python() {
  if (const char* python = std::getenv("PSTRAIN_PYTHON"); python != nullptr && *python != '\0') {
    return python;
  }
  std::error_code error;
  return std::filesystem::exists("/usr/bin/python3", error) ? "/usr/bin/python3" : "python3";
}

std::string ShellQuoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// psctl export: the model of the newest checkpoint of every shard in
// --checkpoint, as --format (psctl/model_export.h).
int Export() {
  const std::string dir = absl::GetFlag(FLAGS_checkpoint);
  const std::string format = absl::GetFlag(FLAGS_format);
  if (dir.empty()) {
    ExitWithError(kProgram, absl::InvalidArgumentError(
                                "psctl export: give --checkpoint=DIR, the job's "
                                "training.checkpoint.dir"));
  }
  if (format != "npz" && format != "pt") {
    ExitWithError(kProgram, absl::InvalidArgumentError(absl::StrCat(
                                "psctl export: unknown --format=", format, "; use npz or pt")));
  }
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) out = absl::StrCat("model.", format);
  absl::StatusOr<std::vector<ShardCheckpoint>> shards = ReadShardCheckpoints(dir);
  if (!shards.ok()) ExitWithError(kProgram, shards.status());
  absl::StatusOr<std::vector<NpzArray>> arrays = ModelArrays(*shards);
  if (!arrays.ok()) ExitWithError(kProgram, arrays.status());
  const std::string npz = format == "npz" ? out : absl::StrCat(out, ".npz.tmp");
  if (absl::Status s = WriteNpz(npz, *arrays); !s.ok()) ExitWithError(kProgram, s);
  if (format == "pt") {
    const std::string python = Python();
    const int rc = std::system(absl::StrCat(ShellQuoted(python), " -c ", ShellQuoted(kToTorch), " ",
                                            ShellQuoted(npz), " ", ShellQuoted(out))
                                   .c_str());
    std::remove(npz.c_str());
    const int code = rc >= 0 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 3) {
      ExitWithError(kProgram, absl::FailedPreconditionError(absl::StrCat(
                                  "psctl export --format=pt needs numpy and torch in ", python,
                                  ": install python3-torch (or pip install torch), set "
                                  "PSTRAIN_PYTHON to a python3 that has them, or use --format=npz")));
    }
    if (code != 0) {
      ExitWithError(kProgram, absl::UnavailableError(absl::StrCat(
                                  "psctl export: ", python, " could not write ", out,
                                  " (its error above); --format=npz writes without Python")));
    }
  }
  int64_t versions_low = (*shards)[0].version(), versions_high = versions_low;
  for (const ShardCheckpoint& s : *shards) {
    versions_low = std::min(versions_low, s.version());
    versions_high = std::max(versions_high, s.version());
  }
  std::printf("wrote %s: %zu array(s) from %zu shard(s) of %s (versions %lld..%lld)\n",
              out.c_str(), arrays->size(), shards->size(), dir.c_str(),
              static_cast<long long>(versions_low), static_cast<long long>(versions_high));
  return 0;
}

}  // namespace
}  // namespace pst

int main(int argc, char** argv) {
  std::vector<char*> args = pst::ParseCommandLineFlags(
      argc, argv,
      "Looks at and steers a running cluster.\n"
      "Usage: psctl status|checkpoint|shutdown|token|plan --config=cluster.textproto\n"
      "  status      each shard (address, version, variables, bytes, pushes, checkpoints written\n"
      "              and failed), each embedding table's share of each shard (rows, bytes,\n"
      "              rows admitted and refused), what each shard refused (exchanges, sessions,\n"
      "              connections, region handoffs) and each worker (last step, lag behind the PS,\n"
      "              last seen, pushes dropped)\n"
      "  checkpoint  every shard writes a checkpoint now (needs training.checkpoint.dir; a delta\n"
      "              over the one before where training.checkpoint.full_every says so)\n"
      "  shutdown    every shard stops cleanly; workers then exit\n"
      "  token       with --task=worker:N, that worker's own token (for PSTRAIN_TASK_TOKEN):\n"
      "              with it the worker can act as worker:N only\n"
      "  plan        with --link=25gbit --rtt=100us --worker_step_ms=MS: the predicted step\n"
      "              time and samples/s for K = 1..16 shards, and the smallest K within 5%\n"
      "              of the best (the cost model of docs/benchmarks.md); contacts no shard\n"
      "Usage: psctl export --checkpoint=DIR [--format=npz|pt] [--out=FILE]\n"
      "  export      the trained model out of the newest valid checkpoint of every shard (a\n"
      "              delta with its chain applied) in\n"
      "              DIR (the job's training.checkpoint.dir; no config, no shard running):\n"
      "              each dense variable whole under its name (the slices over the shards\n"
      "              joined), each embedding table as <table>.ids (int64, sorted) and\n"
      "              <table>.rows (float32 [n, dim]), plus <table> (float32 [max_id+1, dim],\n"
      "              ids not held being their initial values) when every id is under 2^24\n"
      "              and max_id+1 <= 4n. No optimizer state. npz: numpy.load reads it; pt:\n"
      "              torch.load reads a dict of tensors (needs python3 with numpy and torch,\n"
      "              $PSTRAIN_PYTHON or /usr/bin/python3). Default --out: model.<format>",
      pst::kPsctl);
  spdlog::set_level(spdlog::level::warn);
  if (args.size() != 2) {
    pst::ExitWithError("psctl", absl::InvalidArgumentError(
                                    "say what to do: psctl status|checkpoint|shutdown|token|plan "
                                    "--config=FILE, or psctl export --checkpoint=DIR"));
  }
  // Reads files only: no config, no shard.
  if (std::string(args[1]) == "export") return pst::Export();
  absl::StatusOr<pst::JobConfig> config = pst::LoadJobConfigFromFlags();
  if (!config.ok()) pst::ExitWithError("psctl", config.status());
  const std::string command = args[1];
  if (command == "status") return pst::Status(*config);
  if (command == "checkpoint") return pst::Checkpoint(*config);
  if (command == "shutdown") return pst::Shutdown(*config);
  if (command == "token") return pst::Token(*config);
  if (command == "plan") return pst::PlanCluster(*config);
  pst::ExitWithError("psctl", absl::InvalidArgumentError(absl::StrCat(
                                  "unknown command \"", command,
                                  "\"; use status, checkpoint, shutdown, token, plan or export")));
}
