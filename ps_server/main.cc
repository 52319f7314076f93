// ps_server: one parameter-server shard. Started as
//   ps_server --config=cluster.textproto --task=ps:0
// it listens on cluster.ps[0] and serves until SIGTERM/SIGINT or a Shutdown RPC.
// An address with port 0 binds a port the system picks; --port_file reports it.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/durable_file.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/process_memory.h"
#include "common/tf_config.h"
#include "rpc/grpc_experiments.h"
#include "ps_server/checkpointer.h"
#include "ps_server/parameter_shard.h"
#include "ps_server/ps_metrics.h"
#include "ps_server/ps_service.h"
#include "ps_server/rpc_limits.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, task, "",
          "Which shard this is: ps:<index> into cluster.ps (default: TF_CONFIG's task, else ps:0).");
ABSL_FLAG(std::string, listen, "",
          "Address to bind instead of cluster.ps[index] (e.g. 0.0.0.0:50051 behind NAT).");
ABSL_FLAG(std::string, port_file, "",
          "Once serving, write the port this shard got to this file (the decimal number and a "
          "newline), atomically: PATH.tmp, then renamed to PATH. An old file at PATH is removed "
          "at start, so the file appearing means this process serves. For an address with port "
          "0 (cluster.ps[index] or --listen, e.g. 127.0.0.1:0), which binds a port the system "
          "picks: give the workers a config with that port (pslaunch does this itself).");
ABSL_FLAG(int, max_message_bytes, pst::kDefaultMaxRequestBytes,
          "Largest request (Init, Push, ...) this shard accepts, in bytes; a larger one is "
          "refused with RESOURCE_EXHAUSTED and changes nothing.");
ABSL_FLAG(std::string, checkpoint_start, "auto",
          "What to do with the checkpoints in training.checkpoint.dir at start. auto: restore "
          "this run's newest valid checkpoint, start fresh if the directory holds none, and "
          "refuse to start (exit 2) if it holds checkpoints of which none is this run's to "
          "restore (all damaged, another run's or job's, or a finished run's). restore: restore "
          "the newest valid checkpoint, whichever run wrote it (resume a run). fresh: start from "
          "the initial weights, moving the old checkpoints to <dir>/shard-<i>/previous/.");
ABSL_FLAG(int, max_names_per_request, pst::RpcLimits().max_names_per_request,
          "Most variables one exchange's pull may name or its push carry; more, or a name given "
          "twice, is refused with INVALID_ARGUMENT.");
ABSL_FLAG(int64_t, max_reply_bytes, pst::RpcLimits().max_reply_bytes,
          "Largest answer the PS encodes for one pull in a 16-bit wire type, in bytes; a pull "
          "whose answer would be larger is refused with RESOURCE_EXHAUSTED before it is built "
          "(float32 answers are sent from the variables' own buffers, which this does not "
          "bound).");
ABSL_FLAG(double, max_pull_wait_seconds,
          absl::ToDoubleSeconds(pst::RpcLimits().max_pull_wait),
          "Longest a pull waits for its min_version, whatever timeout_ms it asks for; then it "
          "ends with DEADLINE_EXCEEDED. Keep it above training.pull_timeout_seconds.");
ABSL_FLAG(int, max_streams, pst::RpcLimits().max_streams,
          "Exchanges (pushes and pulls, long-polls included) open at once; one more is refused "
          "with RESOURCE_EXHAUSTED. Training opens one per worker at a time.");
ABSL_FLAG(int, max_streams_per_worker, pst::RpcLimits().max_streams_per_worker,
          "Exchanges open at once for one worker id; one more is refused with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, stream_idle_timeout_seconds,
          absl::ToDoubleSeconds(pst::RpcLimits().stream_idle_timeout),
          "An exchange that waits this long on its client (for its next message, or for it "
          "to read the last one) is ended with DEADLINE_EXCEEDED and its buffers are freed; "
          "nothing of an unfinished push is applied.");
ABSL_FLAG(int, max_connections, pst::RpcLimits().max_connections,
          "TCP connections held open at once, checked as each is accepted (before TLS or a "
          "token); one more waits in the listener's backlog until one closes. 0: what the "
          "descriptor limit (raised to its hard limit) leaves beside a reserve for checkpoints "
          "and logs.");
ABSL_FLAG(int, max_connections_per_source, pst::RpcLimits().max_connections_per_source,
          "TCP connections held open at once from one source address; one more is reset and "
          "counted.");
ABSL_FLAG(double, handshake_timeout_seconds,
          absl::ToDoubleSeconds(pst::RpcLimits().handshake_timeout),
          "A connection that has not finished its TLS handshake and sent its HTTP/2 settings "
          "within this is closed.");
ABSL_FLAG(double, connection_idle_timeout_seconds,
          absl::ToDoubleSeconds(pst::RpcLimits().connection_idle_timeout),
          "A connection with no call open for this long is closed (a worker connects again at "
          "its next call), so that idle connections do not hold the connection caps.");
ABSL_FLAG(int64_t, min_push_bytes_per_second, pst::RpcLimits().min_push_bytes_per_second,
          "A push still arriving while it holds push buffer budget must bring at least this many "
          "bytes per second over each --stream_idle_timeout_seconds, or its exchange is ended "
          "with DEADLINE_EXCEEDED and the budget given back (a client dripping a few bytes is "
          "never idle); 0: no minimum.");
ABSL_FLAG(int64_t, max_push_buffer_bytes, pst::RpcLimits().max_push_buffer_bytes,
          "Bytes that pushes being received may hold in total before they are applied (every "
          "SYNC push holds its shard's share); a push that would pass it, while others "
          "hold some, is refused with RESOURCE_EXHAUSTED. 0: one share per worker, plus one.");
ABSL_FLAG(int, max_server_threads, pst::RpcLimits().max_server_threads,
          "Threads that serve the gRPC calls; no call holds one while it waits (a waiting pull "
          "or AwaitWorkersDone leaves a waiter in the shard), so they are all the threads "
          "calls get. 0: automatic (one).");
ABSL_FLAG(bool, allow_insecure, false,
          "Serve plaintext (no cluster.tls) on an address other machines can reach; only on a "
          "trusted network, such as a private container network.");

namespace {

constexpr char kProgram[] = "ps_server";

// InvalidArgument unless the folder of --port_file exists and this process
// may write there.
absl::Status CheckPortFile(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = std::filesystem::path(".");
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error) || access(folder.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--port_file=", path, ": ", folder.string(),
        " is not a folder this user can write to; create it or name another path"));
  }
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port_file=", path, " is a directory; name a file in it"));
  }
  return absl::OkStatus();
}

// Removes an old port file, so that the file appearing means this process serves.
absl::Status RemoveOldPortFile(const std::string& path) {
  std::error_code error;
  if (path.empty() || std::filesystem::remove(path, error) || !error) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--port_file=", path,
                                                 ": cannot remove the old file (", error.message(),
                                                 "); remove it or name another path"));
}

// Writes "<port>\n" to PATH.tmp and renames it to PATH, so that a reader
// never sees a partial number.
absl::Status WritePortFile(const std::string& path, int port) {
  absl::Status written = pst::WriteFileDurably(path, absl::StrCat(port, "\n"));
  if (written.ok()) return written;
  return absl::Status(written.code(), absl::StrCat("--port_file: ", written.message()));
}

// `address` with its port replaced by `port`: what the PS is bound to.
std::string BoundAddress(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address
                                    : absl::StrCat(address.substr(0, colon + 1), port);
}

pst::RpcLimits RpcLimitsFromFlags() {
  return pst::RpcLimits{
      .max_request_bytes = absl::GetFlag(FLAGS_max_message_bytes),
      .max_names_per_request = absl::GetFlag(FLAGS_max_names_per_request),
      .max_reply_bytes = absl::GetFlag(FLAGS_max_reply_bytes),
      .max_pull_wait = absl::Seconds(absl::GetFlag(FLAGS_max_pull_wait_seconds)),
      .max_streams = absl::GetFlag(FLAGS_max_streams),
      .max_streams_per_worker = absl::GetFlag(FLAGS_max_streams_per_worker),
      .stream_idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_timeout_seconds)),
      .min_push_bytes_per_second = absl::GetFlag(FLAGS_min_push_bytes_per_second),
      .max_push_buffer_bytes = absl::GetFlag(FLAGS_max_push_buffer_bytes),
      .max_connections = absl::GetFlag(FLAGS_max_connections),
      .max_connections_per_source = absl::GetFlag(FLAGS_max_connections_per_source),
      .handshake_timeout = absl::Seconds(absl::GetFlag(FLAGS_handshake_timeout_seconds)),
      .connection_idle_timeout =
          absl::Seconds(absl::GetFlag(FLAGS_connection_idle_timeout_seconds)),
      .max_server_threads = absl::GetFlag(FLAGS_max_server_threads),
  };
}

// What the signal waiter does with SIGINT/SIGTERM.
struct SignalWaiter {
  std::thread thread;
  // Set once the PS serves: a signal before that (restoring a checkpoint,
  // binding) ends the process at once, as there is nothing to hand over.
  std::atomic<bool> serving{false};
  // Set once the PS has stopped; the thread then ends.
  absl::Notification finished;
};

// Blocks SIGINT/SIGTERM in every thread and starts a thread that waits for
// them: the first one while serving runs `on_signal` (a graceful stop,
// with its final checkpoint); one before serving, or a second one a second
// or more after the first, ends the process at once, so that no exit path
// ignores SIGTERM. A repeat within that second is the same request sent
// twice (timeout(1) signals the process and then its group), not an
// insistence.
void StartSignalWaiter(SignalWaiter* waiter, std::function<void()> on_signal) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  waiter->thread = std::thread([signals, waiter, on_signal = std::move(on_signal)] {
    timespec poll_interval{0, 100'000'000};
    bool stopping = false;
    absl::Time stop_asked;
    while (!waiter->finished.HasBeenNotified()) {
      const int signal = sigtimedwait(&signals, nullptr, &poll_interval);
      if (signal <= 0) continue;
      const char* name = signal == SIGINT ? "SIGINT" : "SIGTERM";
      if (stopping && absl::Now() - stop_asked < absl::Seconds(1)) {
        spdlog::info("received {} again at once; already stopping", name);
        continue;
      }
      if (stopping || !waiter->serving.load()) {
        spdlog::warn("received {} {}; exiting now", name,
                     stopping ? "again while stopping" : "before serving");
        spdlog::default_logger()->flush();
        std::_Exit(128 + signal);
      }
      spdlog::info("received {}, shutting down", name);
      stopping = true;
      stop_asked = absl::Now();
      on_signal();
    }
  });
}

// Ends the waiter once the PS has stopped (or failed to start).
void JoinSignalWaiter(SignalWaiter* waiter) {
  waiter->finished.Notify();
  waiter->thread.join();
}

}  // namespace

int main(int argc, char** argv) {
  pst::KeepLargeBuffersWarm();
  pst::EnableTransportExperiments();
  pst::ParseCommandLineFlags(argc, argv,
      "One parameter-server shard: holds its variables and optimizer state and serves "
      "Register/Init/Pull/Push over gRPC.\n"
      "Usage: ps_server --config=configs/local.textproto --task=ps:0 [--mode=async]\n"
      "With cluster.ps[0] \"127.0.0.1:0\" it binds a free port and, with "
      "--port_file=PATH, writes that port to PATH once serving.");

  absl::StatusOr<pst::JobConfig> config = pst::LoadJobConfigFromFlags(pst::PsPorts::kMayBeZero);
  if (!config.ok()) pst::ExitWithError(kProgram, config.status());
  absl::StatusOr<pst::TaskId> task =
      pst::ResolveTaskFromEnvironment(absl::GetFlag(FLAGS_task), pst::TaskId::Kind::kPs, kProgram);
  if (!task.ok()) pst::ExitWithError(kProgram, task.status());
  if (absl::Status s = pst::ValidateTask(*config, *task); !s.ok()) pst::ExitWithError(kProgram, s);
  if (absl::GetFlag(FLAGS_max_message_bytes) <= 0) {
    pst::ExitWithError(kProgram, absl::InvalidArgumentError(
        "--max_message_bytes must be a positive number of bytes (default 268435456, 256 MiB)"));
  }
  absl::StatusOr<pst::CheckpointStart> checkpoint_start =
      pst::ParseCheckpointStart(absl::GetFlag(FLAGS_checkpoint_start));
  if (!checkpoint_start.ok()) pst::ExitWithError(kProgram, checkpoint_start.status());
  const pst::RpcLimits limits = RpcLimitsFromFlags();
  if (absl::Status s = pst::ValidateRpcLimits(limits); !s.ok()) pst::ExitWithError(kProgram, s);
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (absl::GetFlag(FLAGS_check_config)) {
    absl::Status files = pst::CheckTaskFiles(*config, /*ps=*/true, /*workers=*/false);
    if (files.ok()) files = CheckPortFile(port_file);
    pst::FinishConfigCheck(kProgram, *config, files);
  }
  if (absl::Status s = CheckPortFile(port_file); !s.ok()) pst::ExitWithError(kProgram, s);
  if (absl::Status s = RemoveOldPortFile(port_file); !s.ok()) pst::ExitWithError(kProgram, s);
  // A file-size limit (ulimit -f) makes a checkpoint write fail, not the PS die.
  std::signal(SIGXFSZ, SIG_IGN);

  // Before any metric registers: every series carries them.
  pst::metrics::SetProcessLabels({{"task", task->ToString()}, {"shard", std::to_string(task->index)}});
  pst::ShardOptions options = pst::ShardOptionsFromConfig(*config, task->index);
  absl::StatusOr<std::unique_ptr<pst::ParameterShard>> shard = pst::ParameterShard::Create(options);
  if (!shard.ok()) pst::ExitWithError(kProgram, shard.status());
  absl::Notification stop;
  std::atomic<bool> stop_requested{false};
  auto request_stop = [&stop, &stop_requested] {
    if (!stop_requested.exchange(true)) stop.Notify();
  };
  SignalWaiter signal_waiter;
  StartSignalWaiter(&signal_waiter, request_stop);
  // After the waiter: the metrics server's threads inherit SIGINT/SIGTERM
  // blocked, so that a signal reaches the waiter, not the default action.
  absl::StatusOr<std::unique_ptr<pst::metrics::MetricsServer>> metrics_server =
      pst::metrics::StartMetricsServerFromFlags(task->ToString());
  if (!metrics_server.ok()) {
    JoinSignalWaiter(&signal_waiter);
    pst::ExitWithError(kProgram, metrics_server.status());
  }

  std::string address = absl::GetFlag(FLAGS_listen);
  if (address.empty()) address = config->cluster().ps(task->index);
  absl::StatusOr<pst::ClusterSecurity> security =
      pst::ClusterSecurity::FromConfig(config->cluster(), pst::ClusterSecurity::Role::kServer);
  absl::Status secure_enough =
      security.ok() ? pst::CheckListenAddress(address, *security, absl::GetFlag(FLAGS_allow_insecure))
                    : security.status();
  if (!secure_enough.ok()) {
    JoinSignalWaiter(&signal_waiter);
    pst::ExitWithError(kProgram, secure_enough);
  }
  // Restore before serving, so no worker ever sees the fresh state.
  const pst::CheckpointConfig& checkpoints = config->training().checkpoint();
  pst::Checkpointer checkpointer(shard->get(), checkpoints, task->index,
                                 {checkpoints.run_id(), pst::TrainingConfigHash(*config)});
  absl::Mutex gave_up_mu;
  absl::Status gave_up;  // the checkpoint writer's (or --port_file's) reason to stop the PS
  checkpointer.set_on_give_up([&](const absl::Status& reason) {
    {
      absl::MutexLock lock(&gave_up_mu);
      gave_up = reason;
    }
    request_stop();
  });
  pst::AdminHooks hooks;
  hooks.shutdown = request_stop;
  absl::StatusOr<int64_t> restored = checkpointer.Prepare(*checkpoint_start);
  if (!restored.ok()) {
    JoinSignalWaiter(&signal_waiter);
    pst::ExitWithError(kProgram, absl::Status(restored.status().code(),
                                              absl::StrCat(task->ToString(), ": ",
                                                           restored.status().message())));
  }
  if (*restored >= 0) {
    spdlog::info("{} restored its checkpoint at version {}", task->ToString(), *restored);
  }
  if (!checkpoints.dir().empty()) {
    hooks.checkpoint = [&checkpointer]() -> absl::StatusOr<pst::CheckpointResponse> {
      absl::StatusOr<pst::Checkpointer::Written> written = checkpointer.CheckpointNow();
      if (!written.ok()) return written.status();
      pst::CheckpointResponse response;
      response.set_path(written->path);
      response.set_version(written->version);
      return response;
    };
  }
  for (const std::string& warning : security->warnings()) spdlog::warn("{}", warning);
  if (std::optional<std::string> warning =
          pst::InsecureListenWarning(address, *security, absl::GetFlag(FLAGS_allow_insecure))) {
    spdlog::warn("{}", *warning);
  }
  if (std::optional<std::string> warning = pst::metrics::ExposureWarningFromFlags(security->tls())) {
    spdlog::warn("{}", *warning);
  }
  absl::StatusOr<pst::RunningServer> server =
      pst::StartGrpcServer(address, shard->get(), hooks, *security, limits,
                           config->cluster().shm() != pst::SHM_OFF);
  if (!server.ok()) {
    JoinSignalWaiter(&signal_waiter);
    // A port taken for now (UNAVAILABLE) is worth a restart: exit 1.
    pst::ExitWithStatus(kProgram, server.status());
  }
  pst::ExportShardMetrics([service = server->service.get()] {
    pst::StatsResponse stats;
    service->Stats(&stats);
    return stats;
  });
  spdlog::info("{} serving {} ({} mode, {} worker(s), optimizer {}, {})", task->ToString(),
               BoundAddress(address, server->port), pst::ModeName(options.mode),
               options.num_workers, (*shard)->optimizer_name(),
               !security->tls()         ? "plaintext"
               : security->has_token() ? "TLS + token"
                                        : "TLS");

  checkpointer.Start();
  signal_waiter.serving.store(true);
  // Last, so that whoever reads the port finds the PS serving, with SIGTERM
  // a graceful stop. A port nobody learns is no use: stop.
  if (!port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, server->port); !s.ok()) {
      {
        absl::MutexLock lock(&gave_up_mu);
        gave_up = s;
      }
      request_stop();
    }
  }
  stop.WaitForNotification();
  // No update lands after this, so the final checkpoint is the final state,
  // and none lands unsaved after the checkpoint writer gave up.
  (*shard)->BeginShutdown();
  checkpointer.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  JoinSignalWaiter(&signal_waiter);
  metrics_server->reset();  // no scrape may read the shard from here on
  pst::StatsResponse stats;
  (*shard)->Stats(&stats);
  spdlog::info("stopped at version {}: {} pushes applied, {} aggregated, {} dropped, {} rejected",
               stats.version(), stats.pushes_applied(), stats.pushes_aggregated(),
               stats.pushes_dropped(), stats.pushes_rejected());
  absl::MutexLock lock(&gave_up_mu);
  if (!gave_up.ok()) {
    // Not 2: the disk may recover, and a restarted PS loses at most every_steps.
    std::fprintf(stderr, "%s: error: %s: %s\n", kProgram, task->ToString().c_str(),
                 std::string(gave_up.message()).c_str());
    return 1;
  }
  return 0;
}
