// pslaunch: runs every task of a cluster config on this host (each PS shard
// and each worker as its own process), supervises them, and prints a JSON
// summary of the run as the last line of stdout.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "pslaunch/ports.h"
#include "pslaunch/relay_files.h"
#include "pslaunch/report.h"
#include "pslaunch/run_config.h"
#include "pslaunch/summary.h"
#include "pslaunch/supervisor.h"
#include "pslaunch/tasks.h"
#include "result.pb.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, bin_dir, "",
          "Directory holding the ps_server and worker binaries (default: the directory "
          "pslaunch itself is in).");
ABSL_FLAG(std::string, result_dir, "",
          "Directory for the effective config (cluster.textproto) and each worker's result "
          "(worker-<i>.json); kept after the run. Default: a fresh directory under /tmp, "
          "removed at the end.");
ABSL_FLAG(std::string, report, "",
          "Write the loss and accuracy curves of every worker to this self-contained HTML page, "
          "and the run's record to the same name with .json (psreport draws several of those "
          "on one page). Default: report.html in --result_dir when that is set, else none.");
ABSL_FLAG(int, grace_seconds, 10,
          "When stopping, how long tasks get to exit after SIGTERM before they are killed.");
ABSL_FLAG(int, max_local_tasks, 0,
          "Refuse a config with more tasks (PS shards + workers) than this: each is a process "
          "of this host. 0 = 4 per CPU, at least 16. Larger clusters span hosts: start their "
          "tasks there with ps_server and worker.");
ABSL_FLAG(int, port_timeout_seconds, 120,
          "How long each PS whose cluster.ps address has port 0 gets to bind and report the "
          "port it got (after restoring its checkpoint) before pslaunch stops the run.");

ABSL_FLAG(bool, relay, false,
          "Put the HTTP/2 relay nghttpx in front of every PS shard (task relay:<i>): the "
          "shard listens at a socket file of mode 0600 in the run's directory, the relay at "
          "its cluster.ps address (a fixed port), with cluster.tls on both of its sides. It "
          "ends the HTTP/2 floods gRPC 1.51 does not bound (docs/hardening.md); use it where "
          "users of this host are not trusted. Needs nghttp2-proxy.");
ABSL_FLAG(std::string, relay_conf, "",
          "The relay's configuration file (default: share/pstrain/deploy/relay/nghttpx.conf of "
          "the install --bin_dir is in, "
          "deploy/relay/nghttpx.conf of the source tree --bin_dir was built in, or "
          "/etc/pstrain/relay/nghttpx.conf, the first that exists).");
ABSL_FLAG(std::string, relay_binary, "",
          "The relay's program (default: nghttpx found on PATH, in /usr/sbin or in "
          "/usr/local/sbin).");

// An override this program checks before passing it on (common/overrides.cc).
ABSL_FLAG(int, ps, 0,
          "Run this many PS shards, each at a free loopback port (127.0.0.1:0), in place of "
          "cluster.ps (0: the config's). With a worker command after -- and no --config, 1.");
ABSL_FLAG(int, ps_backups, 0,
          "Give every shard this many backups, each at a free loopback port "
          "(cluster.ps_backups), in place of the config's (0: the config's): with --ps, a "
          "script's job survives the loss of a PS, pslaunch running the job's etcd and "
          "restarting dead replicas.");
ABSL_DECLARE_FLAG(std::string, checkpoint_start);

namespace {

constexpr char kProgram[] = "pslaunch";
// --ps_backups: a chain longer than this buys no safety on one host.
constexpr int kMaxBackupsPerShard = 8;

constexpr char kUsage[] =
    "Runs a whole parameter-server training job on this host: starts one ps_server per "
    "cluster.ps address (ps:0..ps:P-1) and cluster.workers worker processes "
    "(worker:0..worker:W-1), all with the same config after the command-line overrides, "
    "each given the overrides, PS limits and task settings below that it takes; "
    "with cluster.worker_command, each worker task runs that command through /bin/sh -c "
    "instead (a Python worker: PSTRAIN_CONFIG, PSTRAIN_TASK and PSTRAIN_RESULT_FILE in its "
    "environment). "
    "Their output is copied with a \"[task] \" prefix. When every worker has finished, the PS "
    "tasks are stopped and a one-line JSON summary is printed as the last line of stdout:\n"
    "  {\"mode\":\"sync\",\"workers\":2,\"epochs\":1,\"steps\":468,\"test_accuracy\":0.8412,"
    "\"final_loss\":0.41,\"train_samples_per_sec\":9000.0,\"wall_seconds\":12.34,"
    "\"devices\":\"cpu\"}\n"
    "If a task fails, the others are stopped and pslaunch exits with that task's exit code; "
    "on Ctrl-C (SIGINT) or SIGTERM it stops every task and exits 130; a bad config or flag "
    "exits 2.\n"
    "A cluster.ps address with port 0 (\"127.0.0.1:0\") lets that PS bind a free port: "
    "pslaunch starts the PS tasks first, waits for the ports they got, and then starts the "
    "workers with the real addresses, which <result_dir>/cluster.textproto also holds (for "
    "psctl). A restarted PS binds the same port again.\n\n"
    "Examples:\n"
    "A command after -- is the workers' command (cluster.worker_command), as torchrun "
    "takes a script: pslaunch --ps=1 --workers=2 -- python3 train.py --lr=0.1 needs no "
    "config file (the built-in one's job settings, --mode, --learning_rate and the other "
    "overrides apply). A worker command that exits by itself with a code below 128 (a "
    "Python exception) ends the run with that code, unrestarted.\n\n"
    "  pslaunch                                   # the built-in default job\n"
    "  pslaunch --config=configs/local.textproto --mode=async --epochs=3 --workers=4\n"
    "  pslaunch --ps=2 --ps_backups=1 --workers=2 -- python3 train.py   # a backup per shard\n"
    "  pslaunch --report=run.html --logdir=runs/sync --metrics_port=9100   # curves page, "
    "TensorBoard, Prometheus";

// A word as /bin/sh reads it back: quoted unless plainly safe.
std::string ShellWord(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return absl::ascii_isalnum(c) || std::string_view("_-./=:,+@%").find(c) != std::string::npos;
  });
  if (plain) return word;
  return absl::StrCat("'", absl::StrReplaceAll(word, {{"'", "'\\''"}}), "'");
}

// The config overrides of the flags, then --ps and the command after --,
// which replace cluster.ps and cluster.worker_command.
pst::ConfigOverrides LaunchOverrides(const std::vector<std::string>& command) {
  pst::ConfigOverrides overrides = pst::OverridesFromFlags();
  int shards = absl::GetFlag(FLAGS_ps);
  if (shards == 0 && !command.empty() && absl::GetFlag(FLAGS_config).empty()) shards = 1;
  if (shards != 0) {
    overrides.push_back({"ps", absl::StrCat(shards),
                         [shards](absl::string_view, pst::JobConfig* config) -> absl::Status {
                           if (shards < 1 || shards > 1024) {
                             return absl::InvalidArgumentError(
                                 "give 1 to 1024 shards, or 0 for the config's cluster.ps");
                           }
                           config->mutable_cluster()->clear_ps();
                           for (int i = 0; i < shards; ++i) {
                             config->mutable_cluster()->add_ps("127.0.0.1:0");
                           }
                           return absl::OkStatus();
                         }});
  }
  if (const int backups = absl::GetFlag(FLAGS_ps_backups); backups != 0) {
    overrides.push_back({"ps_backups", absl::StrCat(backups),
                         [backups](absl::string_view, pst::JobConfig* config) -> absl::Status {
                           if (backups < 1 || backups > kMaxBackupsPerShard) {
                             return absl::InvalidArgumentError(
                                 absl::StrCat("give 1 to ", kMaxBackupsPerShard,
                                              " backups a shard, or 0 for the config's"));
                           }
                           config->mutable_cluster()->clear_ps_backups();
                           for (int i = 0; i < config->cluster().ps_size(); ++i) {
                             pst::PsBackups* shard = config->mutable_cluster()->add_ps_backups();
                             for (int k = 0; k < backups; ++k) shard->add_address("127.0.0.1:0");
                           }
                           return absl::OkStatus();
                         }});
  }
  if (!command.empty()) {
    std::vector<std::string> words;
    for (const std::string& word : command) words.push_back(ShellWord(word));
    const std::string line = absl::StrJoin(words, " ");
    overrides.push_back({"-- (the workers' command)", line,
                         [line](absl::string_view, pst::JobConfig* config) {
                           config->mutable_cluster()->set_worker_command(line);
                           return absl::OkStatus();
                         }});
  }
  return overrides;
}

std::string DefaultBinDir() {
  std::error_code error;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "." : self.parent_path().string();
}

// The run's directory; `*remove_at_end` tells whether pslaunch created it.
absl::StatusOr<std::string> MakeResultDir(bool* remove_at_end) {
  std::string dir = absl::GetFlag(FLAGS_result_dir);
  *remove_at_end = dir.empty();
  if (dir.empty()) {
    std::string pattern = "/tmp/pslaunch.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::ErrnoToStatus(errno, "cannot create a temporary directory under /tmp");
    }
    return pattern;
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create --result_dir ", dir, ": ", error.message()));
  }
  return dir;
}

int MaxLocalTasks() {
  if (int flag = absl::GetFlag(FLAGS_max_local_tasks); flag > 0) return flag;
  return std::max(16, 4 * static_cast<int>(std::thread::hardware_concurrency()));
}

// InvalidArgument when the config has more tasks than this host should run.
absl::Status CheckLocalTaskCount(const pst::JobConfig& config) {
  const int tasks = config.cluster().ps_size() + config.cluster().workers();
  if (absl::GetFlag(FLAGS_max_local_tasks) < 0) {
    return absl::InvalidArgumentError("--max_local_tasks must not be negative");
  }
  if (tasks <= MaxLocalTasks()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the config has ", config.cluster().ps_size(), " ps shard(s) + ", config.cluster().workers(),
      " worker(s) = ", tasks, " tasks, more than the ", MaxLocalTasks(),
      " pslaunch starts on one host (--max_local_tasks); raise it if this host can run them, "
      "or start the tasks on several hosts"));
}

// Names this run in its checkpoints, so that a PS of a later run in the same
// directory does not take them for its own.
void SetRunId(pst::JobConfig* config) {
  pst::CheckpointConfig* checkpoint = config->mutable_training()->mutable_checkpoint();
  if (checkpoint->dir().empty() || !checkpoint->run_id().empty()) return;
  checkpoint->set_run_id(absl::StrCat(
      absl::FormatTime("%Y%m%dT%H%M%S", absl::Now(), absl::LocalTimeZone()), "-", getpid()));
}

void RemoveDir(const std::string& dir) {
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// --report: the curves page and the run record beside it. A report that
// cannot be written is an error naming the path (the run itself finished).
absl::Status WriteReport(const pst::RunSummary& summary, const pst::JobConfig& config,
                 const std::string& dir) {
  std::string path = absl::GetFlag(FLAGS_report);
  if (path.empty() && !absl::GetFlag(FLAGS_result_dir).empty()) path = dir + "/report.html";
  if (path.empty()) return absl::OkStatus();
  std::vector<pst::WorkerResult> workers;
  for (int i = 0; i < config.cluster().workers(); ++i) {
    absl::StatusOr<pst::WorkerResult> result = pst::ReadWorkerResult(pst::WorkerResultPath(dir, i));
    if (result.ok()) workers.push_back(*std::move(result));
  }
  pst::RunRecord record = pst::MakeRunRecord(summary, std::move(workers), pst::DescribeJob(config));
  const std::string record_path = pst::RecordPathFor(path);
  absl::Status written = pst::WriteRunRecord(record, record_path);
  if (written.ok()) written = pst::WriteTextFile(path, pst::RenderReport({record}));
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat("--report: ", written.message(),
                                                     "; the run finished, but its report is lost: "
                                                     "give a writable path"));
  }
  spdlog::info("curves: {} (run record {})", path, record_path);
  return absl::OkStatus();
}

// InvalidArgument unless the folder of --report exists and this process
// may write there: checked before the run, not found out after it.
absl::Status CheckReportPath(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string folder = parent.empty() ? std::string(".") : parent.string();
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error) || access(folder.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--report=", path, ": ", folder,
        " is not a folder this user can write to; create it or name another path"));
  }
  return absl::OkStatus();
}

// Reports how the run ended and returns pslaunch's exit code.
int Finish(const pst::RunOutcome& outcome, const pst::JobConfig& config, const std::string& dir,
           absl::Time start, const std::set<int>& abandoned) {
  switch (outcome.kind) {
    case pst::RunOutcome::Kind::kAllFinished: {
      absl::StatusOr<pst::RunSummary> summary = pst::Summarize(config, dir, start, abandoned);
      if (!summary.ok()) {
        std::fprintf(stderr, "%s: error: %s\n", kProgram,
                     std::string(summary.status().message()).c_str());
        return 1;
      }
      std::printf("%s\n", pst::SummaryLine(*summary).c_str());
      if (absl::Status s = WriteReport(*summary, config, dir); !s.ok()) {
        std::fprintf(stderr, "%s: error: %s\n", kProgram, std::string(s.message()).c_str());
        return 1;
      }
      return 0;
    }
    case pst::RunOutcome::Kind::kChildFailed:
      if (outcome.exit_code == 0) {  // a PS shut down on request before the workers were done
        std::fprintf(stderr, "%s: task %s was shut down (psctl shutdown or SIGTERM); stopped the "
                     "other tasks\n", kProgram, outcome.failed_child.c_str());
        return 0;
      }
      std::fprintf(stderr, "%s: task %s exited with code %d; stopped the other tasks\n", kProgram,
                   outcome.failed_child.c_str(), outcome.exit_code);
      return outcome.exit_code;
    case pst::RunOutcome::Kind::kStopRequested:
      std::fprintf(stderr, "%s: interrupted; stopped every task\n", kProgram);
      return pst::kInterruptedExitCode;
    case pst::RunOutcome::Kind::kReady:
    case pst::RunOutcome::Kind::kTimedOut:
      break;  // RunUntil() only
  }
  return 1;
}

// Runs the tasks to the end under the restart policy: a task that dies is
// started again, up to cluster.max_restarts times; a restarted PS restores
// its checkpoint and a restarted worker resumes, so the run goes on. A PS
// that exits 0 was shut down on purpose (psctl shutdown), and a task that
// exits 2 refused its input (config, flags, data, device): neither is
// restarted, since a restart would fail the same way; nor is an
// unreplicated PS without checkpoints, which would start over from the
// initial weights. A replica of a shard with backups is restarted either
// way: it takes its state from the replica that holds the office (where no
// replica of the published chain is left and there is no checkpoint, none
// takes the office, and the workers' calls fail after
// training.pull_timeout_seconds). A worker
// command (the user's own script) that exits by itself with a code below
// 128 (a Python exception: 1) has given its verdict: the run ends with that
// code, once, and only one killed by a signal (128 + N: kill -9, the OOM
// killer) is restarted. A worker
// other than the chief that is gone for good (code 2 aside) is left behind
// unless training.require_all_workers: the chief reports the model without
// it. `abandoned` gets those workers' indices.
pst::RunOutcome RunWithRestarts(const pst::JobConfig& config, pst::Supervisor* supervisor,
                                std::set<int>* abandoned) {
  absl::flat_hash_map<std::string, int> restarts;
  pst::RunOutcome outcome = supervisor->Run();
  while (outcome.kind == pst::RunOutcome::Kind::kChildFailed && outcome.exit_code != 0) {
    const std::string name = outcome.failed_child;
    const bool is_ps = absl::StartsWith(name, "ps:");
    // A relay holds no state: it is restarted as a PS with checkpoints is.
    const bool is_server = is_ps || absl::StartsWith(name, "relay:");
    const bool script_verdict = !is_server && !config.cluster().worker_command().empty() &&
                                outcome.exit_code > 0 && outcome.exit_code < 128;
    const bool bad_input = outcome.exit_code == pst::kUsageErrorExitCode || script_verdict;
    const bool replicated = config.cluster().ps_backups_size() > 0;
    const bool forgets = is_ps && !replicated && config.training().checkpoint().dir().empty();
    if (!bad_input && !forgets && restarts[name] < config.cluster().max_restarts()) {
      int attempt = ++restarts[name];
      spdlog::warn("task {} exited with code {}; restarting it ({} of {})", name,
                   outcome.exit_code, attempt, config.cluster().max_restarts());
      absl::SleepFor(absl::Milliseconds(200 * attempt));
      if (absl::Status s = supervisor->Restart(name); !s.ok()) {
        spdlog::error("cannot restart {}: {}", name, std::string(s.message()));
        return outcome;
      }
      spdlog::info("task {} restarted (pid {})", name, supervisor->pids().back());
    } else if (!is_server && !bad_input && name != "worker:0" &&
               !config.training().require_all_workers()) {
      spdlog::warn("task {} exited with code {} and is not restarted again; the run goes on "
                   "without it (training.require_all_workers is off)", name, outcome.exit_code);
      if (!supervisor->Abandon(name).ok()) return outcome;
      int index = 0;
      if (absl::SimpleAtoi(name.substr(name.find(':') + 1), &index)) abandoned->insert(index);
    } else {
      if (script_verdict) {
        spdlog::error("{} (the worker command) exited with code {}: the script's own error "
                      "(its output is above), not restarted; the run ends with its code",
                      name, outcome.exit_code);
      }
      if (forgets && !bad_input) {
        spdlog::error("{} exited with code {} and is not restarted: without "
                      "training.checkpoint.dir it would start over from the initial weights",
                      name, outcome.exit_code);
      }
      return outcome;
    }
    outcome = supervisor->Run();
  }
  return outcome;
}

void SetUpLogging() {
  auto logger = spdlog::stderr_color_mt(kProgram);
  logger->set_pattern("%H:%M:%S.%e [pslaunch] %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace

int main(int argc, char** argv) {
  absl::Time start = absl::Now();
  std::vector<char*> positional = pst::ParseCommandLineFlags(argc, argv, kUsage, pst::kPslaunch);
  SetUpLogging();
  // Words after "--" are the workers' command; before it, a word is a
  // mistake (a config file given without --config=, say).
  const bool has_command_marker =
      std::find_if(argv + 1, argv + argc, [](const char* a) { return std::string(a) == "--"; }) !=
      argv + argc;
  if (positional.size() > 1 && !has_command_marker) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(absl::StrCat(
                                     "unexpected argument \"", positional[1],
                                     "\" (options are --name=value; a workers' command goes "
                                     "after --; see --help)")));
  }
  const std::vector<std::string> command(positional.begin() + std::min<size_t>(1, positional.size()),
                                         positional.end());
  int grace_seconds = absl::GetFlag(FLAGS_grace_seconds);
  if (grace_seconds < 0) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError("--grace_seconds must be >= 0"));
  }
  absl::Duration grace = absl::Seconds(grace_seconds);
  if (int port = absl::GetFlag(FLAGS_metrics_port); port < 0 || port > 65535) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(
        absl::StrCat("--metrics_port=", port, " is not a port (1..65535, or 0 for none)")));
  }
  if (int seconds = absl::GetFlag(FLAGS_port_timeout_seconds); seconds <= 0) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(absl::StrCat(
        "--port_timeout_seconds=", seconds, " must be a positive number of seconds")));
  }

  if (absl::Status s = CheckReportPath(absl::GetFlag(FLAGS_report)); !s.ok()) {
    pst::ExitWithError(kProgram, s);
  }

  if (absl::Status s = pst::CheckTfConfigUnset(kProgram); !s.ok()) pst::ExitWithError(kProgram, s);
  absl::StatusOr<pst::JobConfig> config = pst::LoadJobConfig(
      absl::GetFlag(FLAGS_config), LaunchOverrides(command), pst::PsPorts::kMayBeZero);
  if (!config.ok()) pst::ExitWithError(kProgram, config.status());
  absl::Status startable = pst::CheckConfigNamesModel(*config);
  if (startable.ok()) startable = CheckLocalTaskCount(*config);
  if (startable.ok()) {
    startable = pst::ParseCheckpointStart(absl::GetFlag(FLAGS_checkpoint_start)).status();
  }
  if (startable.ok()) startable = pst::ValidateRpcLimits(pst::RpcLimitsFromFlags());
  if (startable.ok()) startable = pst::CheckTaskFiles(*config, /*ps=*/true, /*workers=*/true);
  if (startable.ok()) {
    startable = pst::CheckTaskPorts(
        *config, {absl::GetFlag(FLAGS_metrics_port), absl::GetFlag(FLAGS_metrics_address)});
  }
  std::string bin_dir = absl::GetFlag(FLAGS_bin_dir);
  if (bin_dir.empty()) bin_dir = DefaultBinDir();
  std::pair<std::string, std::string> relay;
  if (startable.ok() && absl::GetFlag(FLAGS_relay)) {
    absl::StatusOr<std::pair<std::string, std::string>> found =
        pst::FindRelay(absl::GetFlag(FLAGS_relay_binary), absl::GetFlag(FLAGS_relay_conf), bin_dir);
    if (found.ok()) relay = *std::move(found);
    startable = found.status();
  }
  if (absl::GetFlag(FLAGS_check_config)) pst::FinishConfigCheck(kProgram, *config, startable);
  if (!startable.ok()) pst::ExitWithError(kProgram, startable);
  SetRunId(&*config);
  bool remove_dir = false;
  absl::StatusOr<std::string> dir = MakeResultDir(&remove_dir);
  if (!dir.ok()) pst::ExitWithError(kProgram, dir.status());
  for (int i = 0; i < config->cluster().workers(); ++i) {
    std::filesystem::remove(pst::WorkerResultPath(*dir, i));  // no stale results from a former run
  }
  // etcd first: it listens on its ports before the replicas' are picked,
  // so that no replica is given one of them (each pick only finds ports
  // free now, and a port picked but not yet bound is free).
  absl::StatusOr<std::unique_ptr<pst::LocalEtcd>> etcd = pst::StartJobEtcd(&*config, *dir);
  if (!etcd.ok()) {
    if (remove_dir) RemoveDir(*dir);
    pst::ExitWithError(kProgram, etcd.status());
  }
  if (absl::Status s = pst::PickReplicaPorts(&*config); !s.ok()) {
    etcd->reset();  // it writes under the run's directory
    if (remove_dir) RemoveDir(*dir);
    pst::ExitWithError(kProgram, s);
  }
  absl::StatusOr<std::string> config_path = pst::WriteEffectiveConfig(*config, *dir);
  if (!config_path.ok()) {
    if (remove_dir) RemoveDir(*dir);
    pst::ExitWithError(kProgram, config_path.status());
  }
  absl::StatusOr<pst::PendingPorts> pending_ports = pst::PortFiles(*config);
  if (!pending_ports.ok()) {
    if (remove_dir) RemoveDir(*dir);
    pst::ExitWithError(kProgram, pending_ports.status());
  }
  // On every way out from here: the run's directory if pslaunch made it,
  // and the port files' directory.
  auto remove_dirs = [&] {
    etcd->reset();  // it writes under the run's directory
    if (remove_dir) RemoveDir(*dir);
    if (!pending_ports->dir.empty()) RemoveDir(pending_ports->dir);
  };

  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher before it stops tasks
  int exit_code = 0;
  {
    pst::Supervisor supervisor(STDOUT_FILENO, STDERR_FILENO);
    if (absl::Status s = supervisor.StopOnSignals(); !s.ok()) {
      remove_dirs();
      pst::ExitWithError(kProgram, s);
    }
    std::vector<std::string> started;
    absl::StatusOr<std::vector<pst::ChildSpec>> tasks = pst::ClusterTasks(
        *config, {bin_dir, *config_path, *dir, pending_ports->files, relay.first, relay.second});
    if (!tasks.ok()) {
      remove_dirs();
      pst::ExitWithError(kProgram, tasks.status());
    }
    // A primary reads its backups' addresses when it starts, so the backups
    // with port 0 report theirs first; the workers need the primaries'.
    pst::PendingPorts backup_ports{.dir = pending_ports->dir, .files = {}};
    for (auto it = pending_ports->files.begin(); it != pending_ports->files.end();) {
      if (pst::IsPsBackupTask(it->first)) {
        backup_ports.files.insert(*it);
        it = pending_ports->files.erase(it);
      } else {
        ++it;
      }
    }
    for (const pst::ChildSpec& task : *tasks) {
      if (!backup_ports.files.empty() && absl::StartsWith(task.name, "ps:") &&
          !pst::IsPsBackupTask(task.name)) {
        std::optional<pst::PortFailure> failed = pst::ResolvePorts(
            backup_ports, absl::GetFlag(FLAGS_port_timeout_seconds), &supervisor, &*config, *dir);
        backup_ports.files.clear();
        if (failed) {
          supervisor.StopAll(grace);
          remove_dirs();
          std::fprintf(stderr, "%s\n", failed->line.c_str());
          return failed->exit_code;
        }
      }
      // The workers need the ports that the PS tasks with port 0 got.
      if (!pending_ports->files.empty() && absl::StartsWith(task.name, "worker:")) {
        std::optional<pst::PortFailure> failed =
            pst::ResolvePorts(*pending_ports, absl::GetFlag(FLAGS_port_timeout_seconds),
                              &supervisor, &*config, *dir);
        pending_ports->files.clear();
        RemoveDir(pending_ports->dir);
        if (failed) {
          supervisor.StopAll(grace);
          remove_dirs();
          std::fprintf(stderr, "%s\n", failed->line.c_str());
          return failed->exit_code;
        }
      }
      if (supervisor.StopRequested()) {  // a stop does not wait for every task to start
        supervisor.StopAll(grace);
        remove_dirs();
        std::fprintf(stderr, "%s: interrupted; stopped every task\n", kProgram);
        return pst::kInterruptedExitCode;
      }
      absl::Status s = supervisor.Start(task);
      if (!s.ok()) {
        supervisor.StopAll(grace);
        remove_dirs();
        pst::ExitWithError(kProgram, absl::Status(s.code(), absl::StrCat(
            task.name, ": ", s.message(), " (is --bin_dir=", bin_dir, " right?)")));
      }
      started.push_back(absl::StrCat(task.name, " (pid ", supervisor.pids().back(), ")"));
    }
    spdlog::info("{} mode, config {}: started {}{}", pst::ModeName(config->training().mode()),
                 *config_path, absl::StrJoin(started, ", "),
                 config->training().checkpoint().run_id().empty()
                     ? ""
                     : absl::StrCat("; run ", config->training().checkpoint().run_id()));

    std::set<int> abandoned;
    pst::RunOutcome outcome = RunWithRestarts(*config, &supervisor, &abandoned);
    if (outcome.kind == pst::RunOutcome::Kind::kAllFinished) {
      spdlog::info("all {} worker(s) finished; stopping the PS tasks", config->cluster().workers());
    }
    supervisor.StopAll(grace);
    std::fflush(stderr);
    exit_code = Finish(outcome, *config, *dir, start, abandoned);
  }
  std::fflush(stdout);
  remove_dirs();
  return exit_code;
}
