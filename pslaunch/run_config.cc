#include "pslaunch/run_config.h"

#include <stdlib.h>

#include <cerrno>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::StatusOr<PendingPorts> PortFiles(const JobConfig& config) {
  PendingPorts pending;
  for (int i = 0; i < config.cluster().ps_size(); ++i) {
    if (!HasPortZero(config.cluster().ps(i))) continue;
    if (pending.dir.empty()) {
      std::string pattern = "/tmp/pslaunch-ports.XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr) {
        return absl::ErrnoToStatus(errno, "cannot create a temporary directory under /tmp");
      }
      pending.dir = pattern;
    }
    pending.files[i] = absl::StrCat(pending.dir, "/ps-", i, ".port");
  }
  return pending;
}

std::optional<PortFailure> ResolvePorts(const PendingPorts& pending, int timeout_seconds,
                                        Supervisor* supervisor, JobConfig* config,
                                        const std::string& dir) {
  std::map<int, int> ports;
  auto all_reported = [&] {
    for (const auto& [shard, file] : pending.files) {
      if (ports.count(shard) > 0) continue;
      if (int port = ReadPort(file); port > 0) ports[shard] = port;
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
      int late = 0;
      for (const auto& [shard, file] : pending.files) {
        if (ports.count(shard) == 0) {
          late = shard;
          break;
        }
      }
      return PortFailure{
          1, absl::StrCat("pslaunch", ": error: ps:", late, " did not report the port it got "
                          "within ", timeout, " s; stopped every task: see its output above, or "
                          "raise --port_timeout_seconds if it takes longer to start (restoring a "
                          "large checkpoint)")};
    }
  }
  std::vector<std::string> resolved;
  ClusterConfig* cluster = config->mutable_cluster();
  for (const auto& [shard, port] : ports) {
    const std::string& address = cluster->ps(shard);
    cluster->set_ps(shard, absl::StrCat(address.substr(0, address.rfind(':') + 1), port));
    resolved.push_back(absl::StrCat("ps:", shard, "=", cluster->ps(shard)));
  }
  if (absl::StatusOr<std::string> written = WriteEffectiveConfig(*config, dir); !written.ok()) {
    return PortFailure{1, absl::StrCat("pslaunch", ": error: ", written.status().message(),
                                       "; stopped every task")};
  }
  spdlog::info("PS tasks bound the ports they got: {}", absl::StrJoin(resolved, " "));
  return std::nullopt;
}

}  // namespace pst
