#include "pslaunch/run_config.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config.h"
#include "common/durable_file.h"
#include "common/status_macros.h"
#include "google/protobuf/text_format.h"
#include "spdlog/spdlog.h"

namespace pst {
namespace {

// The port in a file ps_server --port_file wrote, or 0 while there is none.
int ReadPort(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  int port = 0;
  if (!std::getline(in, text) || !absl::SimpleAtoi(text, &port) || port < 1 || port > 65535) {
    return 0;
  }
  return port;
}

}  // namespace

absl::StatusOr<std::string> WriteEffectiveConfig(const JobConfig& config,
                                                 const std::string& dir) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(config, &text)) {
    return absl::InternalError("cannot print the effective config");
  }
  // Written whole and then renamed: a task (re)starting meanwhile reads the
  // old file or the new one, never a part; and never through a link.
  std::string path = dir + "/cluster.textproto";
  PST_RETURN_IF_ERROR(WriteFileDurably(path, text));
  return path;
}

std::string PsTaskName(int shard, int replica) {
  return replica == 0 ? absl::StrCat("ps:", shard) : absl::StrCat("ps:", shard, ":", replica);
}

bool IsPsBackupTask(const std::string& task) {
  return absl::StartsWith(task, "ps:") && std::count(task.begin(), task.end(), ':') == 2;
}

absl::StatusOr<PendingPorts> PortFiles(const JobConfig& config) {
  PendingPorts pending;
  const ClusterConfig& cluster = config.cluster();
  auto add = [&pending](int shard, int replica) -> absl::Status {
    if (pending.dir.empty()) {
      std::string pattern = "/tmp/pslaunch-ports.XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr) {
        return absl::ErrnoToStatus(errno, "cannot create a temporary directory under /tmp");
      }
      pending.dir = pattern;
    }
    const std::string task = PsTaskName(shard, replica);
    std::string file = absl::StrCat(pending.dir, "/", task, ".port");
    std::replace(file.begin() + static_cast<std::ptrdiff_t>(pending.dir.size()), file.end(), ':',
                 '-');
    pending.files[task] = file;
    return absl::OkStatus();
  };
  for (int i = 0; i < cluster.ps_size(); ++i) {
    if (HasPortZero(cluster.ps(i))) PST_RETURN_IF_ERROR(add(i, 0));
    for (int k = 0; i < cluster.ps_backups_size() && k < cluster.ps_backups(i).address_size();
         ++k) {
      if (HasPortZero(cluster.ps_backups(i).address(k))) PST_RETURN_IF_ERROR(add(i, k + 1));
    }
  }
  return pending;
}

absl::Status PickReplicaPorts(JobConfig* config) {
  ClusterConfig* cluster = config->mutable_cluster();
  if (cluster->ps_backups_size() == 0) return absl::OkStatus();
  std::vector<std::string*> zeros;
  for (std::string& address : *cluster->mutable_ps()) {
    if (HasPortZero(address)) zeros.push_back(&address);
  }
  for (PsBackups& backups : *cluster->mutable_ps_backups()) {
    for (std::string& address : *backups.mutable_address()) {
      if (HasPortZero(address)) zeros.push_back(&address);
    }
  }
  if (zeros.empty()) return absl::OkStatus();
  PST_ASSIGN_OR_RETURN(std::vector<int> ports, FreeLoopbackPorts(static_cast<int>(zeros.size())));
  for (size_t i = 0; i < zeros.size(); ++i) {
    std::string& address = *zeros[i];
    address = absl::StrCat(address.substr(0, address.rfind(':') + 1), ports[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalEtcd>> StartJobEtcd(JobConfig* config, const std::string& dir) {
  ClusterConfig* cluster = config->mutable_cluster();
  if (cluster->ps_backups_size() == 0 || !cluster->membership().etcd_endpoints().empty()) {
    return nullptr;
  }
  PST_ASSIGN_OR_RETURN(std::unique_ptr<LocalEtcd> etcd,
                       LocalEtcd::Start(dir + "/etcd", absl::Seconds(30)));
  cluster->mutable_membership()->add_etcd_endpoints(etcd->endpoint());
  spdlog::info("the shards' membership is in etcd at {} (pid {})", etcd->endpoint(), etcd->pid());
  return etcd;
}

std::optional<PortFailure> ResolvePorts(const PendingPorts& pending, int timeout_seconds,
                                        Supervisor* supervisor, JobConfig* config,
                                        const std::string& dir) {
  std::map<std::string, int> ports;
  auto all_reported = [&] {
    for (const auto& [task, file] : pending.files) {
      if (ports.count(task) > 0) continue;
      if (int port = ReadPort(file); port > 0) ports[task] = port;
    }
    return ports.size() == pending.files.size();
  };
  const int timeout = timeout_seconds;
  const RunOutcome outcome = supervisor->RunUntil(all_reported, absl::Seconds(timeout));
  switch (outcome.kind) {
    case RunOutcome::Kind::kReady:
      break;
    case RunOutcome::Kind::kStopRequested:
      return PortFailure{kInterruptedExitCode,
                         absl::StrCat("pslaunch", ": interrupted; stopped every task")};
    case RunOutcome::Kind::kChildFailed:
      return PortFailure{
          outcome.exit_code != 0 ? outcome.exit_code : 1,
          absl::StrCat("pslaunch", ": task ", outcome.failed_child, " exited with code ",
                       outcome.exit_code, " before it reported the port it got (its output is "
                       "above); stopped the other tasks")};
    case RunOutcome::Kind::kTimedOut:
    default: {
      std::string late;
      for (const auto& [task, file] : pending.files) {
        if (ports.count(task) == 0) {
          late = task;
          break;
        }
      }
      return PortFailure{
          1, absl::StrCat("pslaunch", ": error: ", late,
                          " did not report the port it got "
                          "within ",
                          timeout,
                          " s; stopped every task: see its output above, or "
                          "raise --port_timeout_seconds if it takes longer to start (restoring a "
                          "large checkpoint)")};
    }
  }
  std::vector<std::string> resolved;
  ClusterConfig* cluster = config->mutable_cluster();
  for (const auto& [task, port] : ports) {
    // "ps:<i>" or "ps:<i>:<k>", as PortFiles named it.
    const std::vector<std::string> parts = absl::StrSplit(task, ':');
    int shard = 0;
    int replica = 0;
    if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &shard) ||
        (parts.size() == 3 && !absl::SimpleAtoi(parts[2], &replica))) {
      continue;
    }
    std::string* address = replica == 0
                               ? cluster->mutable_ps(shard)
                               : cluster->mutable_ps_backups(shard)->mutable_address(replica - 1);
    *address = absl::StrCat(address->substr(0, address->rfind(':') + 1), port);
    resolved.push_back(absl::StrCat(task, "=", *address));
  }
  if (absl::StatusOr<std::string> written = WriteEffectiveConfig(*config, dir); !written.ok()) {
    return PortFailure{1, absl::StrCat("pslaunch", ": error: ", written.status().message(),
                                       "; stopped every task")};
  }
  spdlog::info("PS tasks bound the ports they got: {}", absl::StrJoin(resolved, " "));
  return std::nullopt;
}

}  // namespace pst
