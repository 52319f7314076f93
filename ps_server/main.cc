// ps_server: one parameter-server shard. Started as
//   ps_server --config=cluster.textproto --task=ps:0
// it listens on cluster.ps[0] and serves until SIGTERM/SIGINT or a Shutdown RPC.
// An address with port 0 binds a port the system picks; --port_file reports it.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/durable_file.h"
#include "common/exit.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/mutex_checks.h"
#include "common/process_memory.h"
#include "common/tf_config.h"
#include "grpcpp/create_channel.h"
#include "ps_server/core/checkpointer.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/replica_checkpoint_dirs.h"
#include "ps_server/service/ps_metrics.h"
#include "ps_server/service/ps_service.h"
#include "ps_server/service/replica_sender.h"
#include "ps_server/service/rpc_limits.h"
#include "ps_server/service/shard_office.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_experiments.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, task, "",
          "Which shard this is: ps:<index> into cluster.ps (default: TF_CONFIG's task, else ps:0).");
ABSL_FLAG(std::optional<int>, replica, std::nullopt,
          "Which replica of the shard this is: 0, the primary, at cluster.ps[index]; k >= 1, a "
          "backup, at cluster.ps_backups[index].address[k-1], following the primary's updates "
          "(it takes none from workers). Default: TF_CONFIG's task with PSTRAIN_PS_REPLICAS "
          "(docs/deploy.md), else 0.");
ABSL_FLAG(std::string, listen, "",
          "Address to bind instead of cluster.ps[index]: host:port (e.g. 0.0.0.0:50051 behind "
          "NAT), or unix:PATH, a socket file only this user can reach, for the relay of "
          "deploy/relay/nghttpx.conf in front (--port_file then writes 0).");
ABSL_FLAG(std::string, port_file, "",
          "Once serving, write the port this shard got to this file (the decimal number and a "
          "newline), atomically: PATH.tmp, then renamed to PATH. An old file at PATH is removed "
          "at start, so the file appearing means this process serves. For an address with port "
          "0 (cluster.ps[index] or --listen, e.g. 127.0.0.1:0), which binds a port the system "
          "picks: give the workers a config with that port (pslaunch does this itself).");
ABSL_FLAG(bool, exit_when_done, false,
          "Stop as on SIGTERM (the final checkpoint written, exit 0) once every worker of the "
          "job has said it is done and no connection to this shard is left open (the chief has "
          "read the final model and gone): for a shard in the same pod or Job as the workers, "
          "beside a PyTorchJob's master, which would otherwise never complete.");
// Overrides this program reads itself (common/overrides.cc).
ABSL_DECLARE_FLAG(std::string, checkpoint_start);
ABSL_DECLARE_FLAG(bool, allow_insecure);

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
  if (absl::StartsWith(address, "unix:")) return address;
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address
                                    : absl::StrCat(address.substr(0, colon + 1), port);
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

// Where replica `replica` of shard `shard` listens.
std::string ReplicaAddress(const pst::ClusterConfig& cluster, int shard, int replica) {
  return replica == 0 ? cluster.ps(shard) : cluster.ps_backups(shard).address(replica - 1);
}

// One sender to each other replica of the shard: each forwards while this
// process is primary (ps_server/service/replica_sender.h).
absl::StatusOr<std::vector<std::unique_ptr<pst::ReplicaSender>>> StartReplicaSenders(
    const pst::JobConfig& config, pst::ParameterShard* shard, pst::ShardOffice* office,
    const pst::RpcLimits& limits) {
  // A piece's bytes, within the backups' message limit (the same flags as
  // this process's) with room for the message around them.
  constexpr int64_t kPieceFraming = 64 << 10;
  const int64_t limit = limits.max_request_bytes;
  const int64_t max_message_bytes = limit > 2 * kPieceFraming ? limit - kPieceFraming : limit / 2;
  std::vector<std::unique_ptr<pst::ReplicaSender>> senders;
  if (shard->replicas() <= 1) return senders;
  // Backups started beside a new job's primary are waited for (the workers'
  // first reads wait with them), well within the workers' patience.
  constexpr absl::Duration kMaxStartPatience = absl::Seconds(30);
  const absl::Duration start_patience =
      std::min(kMaxStartPatience, absl::Seconds(config.training().pull_timeout_seconds()) / 2);
  absl::StatusOr<pst::ClusterSecurity> security =
      pst::ClusterSecurity::FromConfig(config.cluster(), pst::ClusterSecurity::Role::kClient);
  if (!security.ok()) return security.status();
  for (int r = 0; r < shard->replicas(); ++r) {
    if (r == shard->replica()) continue;
    const std::string address = ReplicaAddress(config.cluster(), shard->shard(), r);
    grpc::ChannelArguments args;
    pst::ConfigureChannel(*security, &args);
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    senders.push_back(std::make_unique<pst::ReplicaSender>(
        shard,
        pst::ParameterServer::NewStub(
            grpc::CreateCustomChannel(address, pst::ChannelCredentials(*security), args)),
        pst::ReplicaSender::Options{
            .replica = r,
            .address = address,
            .max_message_bytes = max_message_bytes,
            .start_patience = start_patience,
            .drop = office == nullptr ? std::function<absl::Status(int)>() : [office](int replica) {
              return office->Drop(replica, absl::Now() + absl::Seconds(1));
            }}));
  }
  return senders;
}

// The shard's office once it runs, for the service's hook: the office
// starts after the server serves, and goes before it stops.
struct OfficeLink {
  absl::Mutex mu;
  pst::ShardOffice* office ABSL_GUARDED_BY(mu) = nullptr;
};

// Whether `primary` answers its Stats, within a fraction of a lease, as the
// shard's primary at its epoch (a replica restarted at a dead primary's
// address answers as a backup).
bool AnswersAsPrimary(const pst::ClusterSecurity& security, const pst::ShardPrimary& primary) {
  constexpr absl::Duration kWithin = absl::Milliseconds(300);
  grpc::ChannelArguments args;
  pst::ConfigureChannel(security, &args);
  auto stub = pst::ParameterServer::NewStub(
      grpc::CreateCustomChannel(primary.address, pst::ChannelCredentials(security), args));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWithin));
  pst::StatsResponse stats;
  const grpc::Status status = stub->Stats(&context, pst::StatsRequest(), &stats);
  return status.ok() && stats.replication().primary() &&
         stats.replication().epoch() == primary.epoch;
}

// The shard's membership in etcd, where the config names one for a
// replicated shard (ps_server/service/shard_office.h); null otherwise.
absl::StatusOr<std::unique_ptr<pst::ShardOffice>> StartShardOffice(const pst::JobConfig& config,
                                                                   pst::ParameterShard* shard,
                                                                   const std::string& address,
                                                                   bool restored) {
  if (!shard->elected()) return nullptr;
  absl::StatusOr<pst::ClusterSecurity> security =
      pst::ClusterSecurity::FromConfig(config.cluster(), pst::ClusterSecurity::Role::kClient);
  if (!security.ok()) return security.status();
  const pst::Membership& membership = config.cluster().membership();
  pst::ShardOffice::Options options;
  options.etcd_endpoints.assign(membership.etcd_endpoints().begin(),
                                membership.etcd_endpoints().end());
  if (!membership.job().empty()) options.job = membership.job();
  options.address = address;
  options.lease = pst::MembershipLease(config);
  options.restored = restored;
  options.primary_answers = [security = *std::move(security)](const pst::ShardPrimary& primary) {
    return AnswersAsPrimary(security, primary);
  };
  return pst::ShardOffice::Start(shard, std::move(options));
}

// Ends the waiter once the PS has stopped (or failed to start).
void JoinSignalWaiter(SignalWaiter* waiter) {
  waiter->finished.Notify();
  waiter->thread.join();
}

}  // namespace

int main(int argc, char** argv) {
  pst::KeepLargeBuffersWarm();
  pst::SkipMutexDeadlockChecks();
  pst::EnableTransportExperiments();
  pst::ParseCommandLineFlags(argc, argv,
      "One parameter-server shard: holds its variables and optimizer state and serves "
      "Register/Init/Pull/Push over gRPC.\n"
      "Usage: ps_server --config=configs/local.textproto --task=ps:0 [--mode=async]\n"
      "With cluster.ps[0] \"127.0.0.1:0\" it binds a free port and, with "
      "--port_file=PATH, writes that port to PATH once serving.",
      pst::kPsServer);

  absl::StatusOr<pst::JobConfig> config = pst::LoadJobConfigFromFlags(pst::PsPorts::kMayBeZero);
  if (!config.ok()) pst::ExitWithError(kProgram, config.status());
  absl::StatusOr<pst::TaskId> task =
      pst::ResolveTaskFromEnvironment(absl::GetFlag(FLAGS_task), pst::TaskId::Kind::kPs, kProgram);
  if (!task.ok()) pst::ExitWithError(kProgram, task.status());
  if (absl::Status s = pst::ValidateTask(*config, *task); !s.ok()) pst::ExitWithError(kProgram, s);
  absl::StatusOr<pst::CheckpointStart> checkpoint_start =
      pst::ParseCheckpointStart(absl::GetFlag(FLAGS_checkpoint_start));
  if (!checkpoint_start.ok()) pst::ExitWithError(kProgram, checkpoint_start.status());
  const pst::RpcLimits limits = pst::RpcLimitsFromFlags();
  if (absl::Status s = pst::ValidateRpcLimits(limits); !s.ok()) pst::ExitWithError(kProgram, s);
  pst::ShardOptions options = pst::ShardOptionsFromConfig(*config, task->index);
  absl::StatusOr<int> replica = pst::ResolveReplicaFromEnvironment(absl::GetFlag(FLAGS_replica));
  if (!replica.ok()) pst::ExitWithError(kProgram, replica.status());
  options.replica = *replica;
  if (options.replica < 0 || options.replica >= options.replicas) {
    pst::ExitWithError(
        kProgram, absl::InvalidArgumentError(absl::StrCat(
                      "--replica=", options.replica, ": shard ", task->index, " has ",
                      options.replicas, " replica(s) in cluster.ps and cluster.ps_backups; give ",
                      options.replicas > 1 ? absl::StrCat("0 to ", options.replicas - 1)
                                           : std::string("0"))));
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (absl::GetFlag(FLAGS_check_config)) {
    absl::Status files = pst::CheckTaskFiles(*config, /*ps=*/true, /*workers=*/false);
    if (files.ok()) files = CheckPortFile(port_file);
    pst::FinishConfigCheck(kProgram, *config, files);
  }
  if (absl::Status s = CheckPortFile(port_file); !s.ok()) pst::ExitWithError(kProgram, s);
  // The tables' disk tiers open at the Init or restore; a directory they
  // cannot use stops the PS now, not at the first worker's Init.
  if (absl::Status s = pst::CheckEmbeddingDisks(*config, /*create=*/true); !s.ok()) {
    pst::ExitWithError(kProgram, s);
  }
  if (absl::Status s = RemoveOldPortFile(port_file); !s.ok()) pst::ExitWithError(kProgram, s);
  // A file-size limit (ulimit -f) makes a checkpoint write fail, not the PS die.
  std::signal(SIGXFSZ, SIG_IGN);

  const std::string task_name = options.replica == 0
                                    ? task->ToString()
                                    : absl::StrCat(task->ToString(), " replica ", options.replica);
  // Before any metric registers: every series carries them. The task as
  // pslaunch names it, so a backup's series are told from its primary's.
  pst::metrics::SetProcessLabels(
      {{"task", options.replica == 0 ? task->ToString()
                                     : absl::StrCat(task->ToString(), ":", options.replica)},
       {"shard", std::to_string(task->index)}});
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
      pst::metrics::StartMetricsServerFromFlags(task_name);
  if (!metrics_server.ok()) {
    JoinSignalWaiter(&signal_waiter);
    pst::ExitWithError(kProgram, metrics_server.status());
  }

  std::string address = absl::GetFlag(FLAGS_listen);
  if (address.empty()) address = ReplicaAddress(config->cluster(), task->index, options.replica);
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
  // A backup's state comes from its primary: it restores nothing, and its
  // checkpoints (the final one, and those it writes once it holds the
  // office) go to a folder of their own, which replica 0 reads too.
  pst::CheckpointConfig checkpoints = config->training().checkpoint();
  if (!checkpoints.dir().empty()) {
    checkpoints.set_dir(pst::ReplicaCheckpointRoot(checkpoints.dir(), options.replica));
  }
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
  auto office_link = std::make_shared<OfficeLink>();
  hooks.primary_sought = [office_link] {
    absl::MutexLock lock(&office_link->mu);
    if (office_link->office != nullptr) office_link->office->PrimarySought();
  };
  absl::StatusOr<int64_t> restored = -1;
  if (options.replica > 0) {
    if (absl::Status s = checkpointer.PrepareBackup(); !s.ok()) restored = s;
  } else {
    restored = checkpointer.Prepare(*checkpoint_start);
  }
  if (!restored.ok()) {
    JoinSignalWaiter(&signal_waiter);
    pst::ExitWithError(kProgram,
                       absl::Status(restored.status().code(),
                                    absl::StrCat(task_name, ": ", restored.status().message())));
  }
  if (*restored >= 0) {
    spdlog::info("{} restored its checkpoint at version {}", task_name, *restored);
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
  if (std::optional<std::string> warning = pst::ExposedListenWarning(address)) {
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
    service->FillStats(&stats);
    return stats;
  });
  spdlog::info("{} serving {} ({} mode, {} worker(s), optimizer {}, {})", task_name,
               BoundAddress(address, server->port), pst::ModeName(options.mode),
               options.num_workers, (*shard)->optimizer_name(),
               !security->tls()        ? "plaintext"
               : security->has_token() ? "TLS + token"
                                       : "TLS");

  // The office names where workers and the other replicas reach this one:
  // its config address (behind a relay, --listen is only the relay's
  // backend), or where it bound when the config leaves the port to the
  // system.
  const std::string configured = ReplicaAddress(config->cluster(), task->index, options.replica);
  absl::StatusOr<std::unique_ptr<pst::ShardOffice>> office = StartShardOffice(
      *config, shard->get(),
      pst::HasPortZero(configured) ? BoundAddress(address, server->port) : configured,
      *restored >= 0);
  if (office.ok()) {
    absl::MutexLock lock(&office_link->mu);
    office_link->office = office->get();
  }
  absl::StatusOr<std::vector<std::unique_ptr<pst::ReplicaSender>>> senders =
      office.ok()
          ? StartReplicaSenders(*config, shard->get(), office->get(), limits)
          : absl::StatusOr<std::vector<std::unique_ptr<pst::ReplicaSender>>>(office.status());
  if (!senders.ok()) {
    {
      absl::MutexLock lock(&gave_up_mu);
      gave_up = senders.status();
    }
    request_stop();
  }
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
  std::thread done_watch;
  if (absl::GetFlag(FLAGS_exit_when_done)) {
    // Polled: the end of a job is no hot path, and a connection's close has
    // no event of its own here.
    done_watch = std::thread([&stop, &request_stop, service = server->service.get(),
                              workers = options.num_workers] {
      while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
        pst::StatsResponse stats;
        service->FillStats(&stats);
        if (stats.workers_done() >= workers && stats.connections_open() == 0) {
          spdlog::info("every worker is done and gone: stopping (--exit_when_done)");
          request_stop();
          return;
        }
      }
    });
  }
  stop.WaitForNotification();
  if (done_watch.joinable()) done_watch.join();
  // No update lands after this, so the final checkpoint is the final state,
  // and none lands unsaved after the checkpoint writer gave up.
  (*shard)->BeginShutdown();
  if (senders.ok()) senders->clear();
  if (office.ok()) {
    {
      absl::MutexLock lock(&office_link->mu);
      office_link->office = nullptr;
    }
    office->reset();  // resigns: a backup takes over at once
  }
  checkpointer.Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  JoinSignalWaiter(&signal_waiter);
  metrics_server->reset();  // no scrape may read the shard from here on
  pst::StatsResponse stats;
  (*shard)->Stats(&stats);
  spdlog::info(
      "stopped at version {}: {} pushes applied, {} aggregated, {} dropped, {} rejected, {} "
      "repeated",
      stats.version(), stats.pushes_applied(), stats.pushes_aggregated(), stats.pushes_dropped(),
      stats.pushes_rejected(), stats.pushes_repeated());
  if (stats.has_replication()) {
    const pst::ReplicationStats& r = stats.replication();
    spdlog::info("replication at epoch {}: forwarded {} updates ({} bytes) to its backups; "
                 "applied {} updates ({} whole states, {} bytes) from its primary",
                 r.epoch(), r.updates_forwarded(), r.bytes_forwarded(), r.updates_applied(),
                 r.states_applied(), r.bytes_applied());
  }
  for (const pst::EmbeddingTableStats& table : stats.embeddings()) {
    if (table.rows_on_disk() == 0 && table.disk_reads() == 0) continue;  // all in RAM
    const int64_t reads = table.lookups_in_memory() + table.disk_reads();
    spdlog::info(
        "table {}: {} rows in RAM, {} on disk; RAM answered {:.1f}% of {} row reads; "
        "of the {} that missed it, {} waited for the disk, {} were read ahead, {} were of ids "
        "the disk never stored",
        table.table(), table.rows_in_memory(), table.rows_on_disk(),
        reads > 0 ? 100.0 * static_cast<double>(table.lookups_in_memory()) / reads : 0.0, reads,
        table.disk_reads(), table.disk_waits(), table.prefetch_hits(), table.disk_reads_filtered());
  }
  absl::MutexLock lock(&gave_up_mu);
  if (!gave_up.ok()) {
    // Not 2: the disk may recover, and a restarted PS loses at most every_steps.
    std::fprintf(stderr, "%s: error: %s: %s\n", kProgram, task_name.c_str(),
                 std::string(gave_up.message()).c_str());
    return 1;
  }
  return 0;
}
