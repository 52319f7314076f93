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
  for (size_t i = 0; i < tasks->size(); ++i) {
    ChildSpec& task = (*tasks)[i];
    const int port = base + static_cast<int>(i);
    task.argv.push_back(absl::StrCat("--metrics_port=", port));
    task.argv.push_back("--metrics_address=" + address);
    mapping.push_back(absl::StrCat(task.name, "=", port));
  }
  spdlog::info("metrics on http://{}:PORT/metrics: {}", address, absl::StrJoin(mapping, " "));
}

void Append(std::vector<std::string> flags, std::vector<std::string>* args) {
  args->insert(args->end(), std::make_move_iterator(flags.begin()),
               std::make_move_iterator(flags.end()));
}

}  // namespace

std::string WorkerResultPath(const std::string& dir, int index) {
  return absl::StrCat(dir, "/worker-", index, ".json");
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
  std::vector<ChildSpec> tasks;
  for (int i = 0; i < config.cluster().ps_size(); ++i) {
    const std::string task = absl::StrCat("ps:", i);
    ChildSpec spec{task,
                   {paths.bin_dir + "/ps_server", "--config=" + paths.config_path,
                    "--task=" + task},
                   /*must_finish=*/false};
    Append(ForwardedFlags(kPsServer, Forwarding::kEveryStart), &spec.argv);
    Append(ForwardedFlags(kPsServer, Forwarding::kFirstStart), &spec.first_start_args);
    if (auto file = paths.port_files.find(i); file != paths.port_files.end()) {
      spec.first_start_args.push_back("--port_file=" + file->second);
    }
    tasks.push_back(std::move(spec));
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
      if (absl::StartsWith(task.name, "worker:")) RunWorkerCommand(command, &task);
    }
  }
  return tasks;
}

}  // namespace pst
