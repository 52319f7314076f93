#include "pslaunch/tasks.h"

#include <optional>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics_http.h"
#include "common/overrides.h"
#include "common/security.h"
#include "pslaunch/ports.h"
#include "pslaunch/run_config.h"
#include "pslaunch/worker_command.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// --metrics_port=P: the first PS serves metrics on P, the other tasks on
// P+1, P+2, ... in task order (PS shards, then workers).
void AssignMetricsPorts(std::vector<ChildSpec>* tasks) {
  const int base = absl::GetFlag(FLAGS_metrics_port);
  if (base == 0) return;
  std::vector<std::string> mapping;
  const std::string address = absl::GetFlag(FLAGS_metrics_address);
  int next = base;
  for (ChildSpec& task : *tasks) {
    if (absl::StartsWith(task.name, "relay:")) continue;  // nghttpx serves no metrics
    const int port = next++;
    task.argv.push_back(absl::StrCat("--metrics_port=", port));
    task.argv.push_back("--metrics_address=" + address);
    mapping.push_back(absl::StrCat(task.name, "=", port));
  }
  spdlog::info("metrics on http://{}:PORT/metrics: {}", address, absl::StrJoin(mapping, " "));
}

// nghttpx in front of shard `shard`: its frontend at cluster.ps[shard], its
// backend the shard's socket file; with cluster.tls, TLS on both sides
// (the client's certificate verified at the front when the config requires
// one, and the task certificate shown to the shard).
absl::StatusOr<ChildSpec> RelayTask(const ClusterConfig& cluster, int shard,
                                    const TaskPaths& paths) {
  const std::string& address = cluster.ps(shard);
  const std::optional<std::pair<std::string, int>> split = SplitHostPort(address);
  if (!split || split->second <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.ps[", shard, "] \"", address, "\": the relay needs a fixed port there"));
  }
  const auto& [host, port] = *split;
  ChildSpec relay{absl::StrCat("relay:", shard),
                  {paths.relay_binary, "--conf=" + paths.relay_conf},
                  /*must_finish=*/false};
  std::string frontend = absl::StrCat("--frontend=", host.empty() ? "*" : host, ",", port);
  std::string backend =
      absl::StrCat("--backend=unix:", RelaySocketPath(paths.result_dir, shard), ";;proto=h2");
  if (!cluster.has_tls()) {
    relay.argv.push_back(frontend + ";no-tls");
    relay.argv.push_back(backend);
    return relay;
  }
  const TlsConfig& tls = cluster.tls();
  relay.argv.push_back(frontend);
  relay.argv.push_back(absl::StrCat(backend, ";tls;sni=",
                                    tls.server_name().empty() ? host : tls.server_name()));
  relay.argv.push_back("--cacert=" + tls.ca());
  relay.argv.push_back("--client-private-key-file=" + tls.key());
  relay.argv.push_back("--client-cert-file=" + tls.cert());
  if (tls.require_client_cert()) {
    relay.argv.push_back("--verify-client");
    relay.argv.push_back("--verify-client-cacert=" + tls.ca());
  }
  relay.argv.push_back(tls.key());
  relay.argv.push_back(tls.cert());
  return relay;
}

void Append(std::vector<std::string> flags, std::vector<std::string>* args) {
  args->insert(args->end(), std::make_move_iterator(flags.begin()),
               std::make_move_iterator(flags.end()));
}

}  // namespace

std::string WorkerResultPath(const std::string& dir, int index) {
  return absl::StrCat(dir, "/worker-", index, ".json");
}

std::string RelaySocketPath(const std::string& dir, int shard) {
  return absl::StrCat(dir, "/ps-", shard, ".sock");
}

absl::StatusOr<std::vector<ChildSpec>> ClusterTasks(const JobConfig& config,
                                                    const TaskPaths& paths) {
  // With cluster.auth each worker carries a token of its own task, so that
  // it can act as no other.
  std::optional<std::string> cluster_token;
  if (config.cluster().has_auth()) {
    absl::StatusOr<std::string> token = ReadClusterToken(config.cluster());
    if (!token.ok()) return token.status();
    cluster_token = *std::move(token);
  }
  const bool relayed = !paths.relay_binary.empty() && !paths.relay_conf.empty();
  std::vector<ChildSpec> tasks;
  auto ps_task = [&](int shard, int replica) {
    const std::string name = PsTaskName(shard, replica);
    ChildSpec spec{name,
                   {paths.bin_dir + "/ps_server", "--config=" + paths.config_path,
                    absl::StrCat("--task=ps:", shard)},
                   /*must_finish=*/false};
    if (replica > 0) spec.argv.push_back(absl::StrCat("--replica=", replica));
    Append(ForwardedFlags(kPsServer, Forwarding::kEveryStart), &spec.argv);
    Append(ForwardedFlags(kPsServer, Forwarding::kFirstStart), &spec.first_start_args);
    if (auto file = paths.port_files.find(name); file != paths.port_files.end()) {
      spec.first_start_args.push_back("--port_file=" + file->second);
    }
    return spec;
  };
  for (int i = 0; i < config.cluster().ps_backups_size(); ++i) {
    for (int k = 1; k <= config.cluster().ps_backups(i).address_size(); ++k) {
      tasks.push_back(ps_task(i, k));
    }
  }
  for (int i = 0; i < config.cluster().ps_size(); ++i) {
    ChildSpec spec = ps_task(i, 0);
    if (relayed) spec.argv.push_back("--listen=unix:" + RelaySocketPath(paths.result_dir, i));
    tasks.push_back(std::move(spec));
    if (relayed) {
      absl::StatusOr<ChildSpec> relay = RelayTask(config.cluster(), i, paths);
      if (!relay.ok()) return relay.status();
      tasks.push_back(*std::move(relay));
    }
  }
  for (int i = 0; i < config.cluster().workers(); ++i) {
    const std::string task = absl::StrCat("worker:", i);
    ChildSpec spec{task,
                   {paths.bin_dir + "/worker", "--config=" + paths.config_path,
                    "--task=" + task, "--result_file=" + WorkerResultPath(paths.result_dir, i)},
                   /*must_finish=*/true};
    Append(ForwardedFlags(kWorker, Forwarding::kEveryStart), &spec.argv);
    Append(ForwardedFlags(kWorker, Forwarding::kFirstStart), &spec.first_start_args);
    if (cluster_token) {
      spec.env.push_back(absl::StrCat(kTaskTokenEnv, "=", TaskToken(*cluster_token, task)));
    }
    tasks.push_back(std::move(spec));
  }
  AssignMetricsPorts(&tasks);
  if (const std::string& command = config.cluster().worker_command(); !command.empty()) {
    for (ChildSpec& task : tasks) {
      if (absl::StartsWith(task.name, "worker:")) {
        RunWorkerCommand(command, config.cluster().workers(), &task);
      }
    }
  }
  return tasks;
}

}  // namespace pst
