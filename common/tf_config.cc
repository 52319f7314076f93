#include "common/tf_config.h"

#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json_depth.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace pst {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// A cluster of kMaxWorkers workers with long host names fits many times.
constexpr size_t kMaxTfConfigBytes = 1 << 20;
// TF_CONFIG nests three levels ({"cluster": {"ps": [...]}}); protobuf's
// parser recurses per level, so deeper text is refused before it sees it.
constexpr int kMaxTfConfigDepth = 8;
// A primary and its backups; each backup applies every update again.
constexpr int kMaxReplicasPerShard = 16;

absl::Status Malformed(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(
      kTfConfigVariable, " ", problem,
      "; expected {\"cluster\": {\"ps\": [\"host:port\", ...], \"worker\": [...]}, "
      "\"task\": {\"type\": \"ps\", \"index\": 0}}"));
}

absl::Status CheckDepth(absl::string_view json) {
  if (LineNestingBeyond(json, kMaxTfConfigDepth)) {
    return Malformed(absl::StrCat("nests more than ", kMaxTfConfigDepth, " levels"));
  }
  return absl::OkStatus();
}

bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  return colon != std::string::npos && colon > 0 &&
         absl::SimpleAtoi(absl::string_view(address).substr(colon + 1), &port) && port >= 0 &&
         port <= 65535;
}

// The addresses listed under cluster[type], which must be a list of
// non-empty strings.
absl::StatusOr<std::vector<std::string>> Addresses(const Struct& cluster, const std::string& type) {
  std::vector<std::string> addresses;
  auto it = cluster.fields().find(type);
  if (it == cluster.fields().end()) return addresses;
  if (it->second.kind_case() != Value::kListValue) {
    return Malformed(absl::StrCat("has cluster.", type, " that is not a list of \"host:port\""));
  }
  const ListValue& list = it->second.list_value();
  for (int i = 0; i < list.values_size(); ++i) {
    const Value& entry = list.values(i);
    if (entry.kind_case() != Value::kStringValue || !IsHostPort(entry.string_value())) {
      return Malformed(absl::StrCat("has cluster.", type, "[", i, "] that is not a \"host:port\" string"));
    }
    addresses.push_back(entry.string_value());
  }
  return addresses;
}

// The task object mapped onto our tasks; `chiefs` is 0 or 1.
absl::StatusOr<TaskId> ParseTaskObject(const Value& task_value, const TfConfig& config,
                                       int chiefs, int worker_entries) {
  if (task_value.kind_case() != Value::kStructValue) return Malformed("has a task that is not an object");
  const auto& fields = task_value.struct_value().fields();
  auto type_it = fields.find("type");
  if (type_it == fields.end() || type_it->second.kind_case() != Value::kStringValue) {
    return Malformed("has a task without a string \"type\"");
  }
  const std::string& type = type_it->second.string_value();
  auto index_it = fields.find("index");
  int index = 0;  // TensorFlow's default too
  if (index_it != fields.end()) {
    const Value& value = index_it->second;
    if (value.kind_case() != Value::kNumberValue || value.number_value() < 0 ||
        value.number_value() != std::floor(value.number_value()) || value.number_value() > 1e6) {
      return Malformed("has a task \"index\" that is not a non-negative integer");
    }
    index = static_cast<int>(value.number_value());
  }
  if (type == "evaluator") {
    return absl::InvalidArgumentError(absl::StrCat(
        kTfConfigVariable, " names an evaluator task, which pstrain does not run: worker 0 (the "
        "chief) evaluates the model after every epoch; remove the Evaluator replica"));
  }
  TaskId task;
  int count = 0;
  if (type == "ps") {
    task = {TaskId::Kind::kPs, index};
    count = static_cast<int>(config.ps.size());
  } else if (type == "chief" || type == "master") {
    task = {TaskId::Kind::kWorker, index};
    count = chiefs;
  } else if (type == "worker") {
    task = {TaskId::Kind::kWorker, chiefs + index};
    count = worker_entries;
  } else {
    return Malformed(absl::StrCat("has task type \"", type,
                                  "\"; pstrain runs ps, chief (or master) and worker tasks"));
  }
  if (index >= count) {
    return Malformed(absl::StrCat("has task ", type, ":", index, " but cluster.", type, " lists ",
                                  count, " task(s)"));
  }
  return task;
}

// PSTRAIN_PS_REPLICAS: replicas per shard, primary included; 1 when unset.
absl::StatusOr<int> ReplicasPerShard(const std::function<const char*(const char*)>& getenv) {
  const char* text = getenv(kPsReplicasVariable);
  if (text == nullptr || *text == '\0') return 1;
  int replicas = 0;
  if (!absl::SimpleAtoi(text, &replicas) || replicas < 1 || replicas > kMaxReplicasPerShard) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPsReplicasVariable, "=", text, " is not a whole number in [1, ", kMaxReplicasPerShard,
        "]; it is how many replicas each shard has, its primary included"));
  }
  return replicas;
}

// PSTRAIN_ETCD: the etcd endpoints, host:port each, comma-separated.
absl::StatusOr<std::vector<std::string>> EtcdEndpoints(
    const std::function<const char*(const char*)>& getenv) {
  std::vector<std::string> endpoints;
  const char* text = getenv(kEtcdVariable);
  if (text == nullptr || *text == '\0') return endpoints;
  for (absl::string_view endpoint : absl::StrSplit(text, ',')) {
    endpoints.emplace_back(absl::StripAsciiWhitespace(endpoint));
    if (!IsHostPort(endpoints.back())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kEtcdVariable, "=", text, " has \"", endpoints.back(),
          "\", which is not host:port; list etcd's client endpoints as host:port,host:port"));
    }
  }
  return endpoints;
}

// Splits `config->ps`, replica-major (see the header), into the shards'
// primaries and their backups, and places a ps task among them.
absl::Status SplitReplicas(int replicas, absl::string_view listed, TfConfig* config) {
  const int listed_count = static_cast<int>(config->ps.size());
  if (listed_count % replicas != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        listed, " lists ", listed_count, " ps address(es), not a multiple of ", kPsReplicasVariable,
        "=", replicas, "; list every shard's primary, then every shard's first backup, and so on"));
  }
  const int shards = listed_count / replicas;
  if (shards > kMaxPsShards) {
    return absl::InvalidArgumentError(
        absl::StrCat(listed, " lists more than ", kMaxPsShards, " shards"));
  }
  if (replicas > 1) {
    config->ps_backups.assign(shards, {});
    for (int j = shards; j < listed_count; ++j)
      config->ps_backups[j % shards].push_back(config->ps[j]);
    config->ps.resize(shards);
  }
  if (config->task && config->task->kind == TaskId::Kind::kPs) {
    config->replica = config->task->index / shards;
    config->task->index %= shards;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TfConfig> ParseTfConfig(absl::string_view json, int replicas) {
  if (json.size() > kMaxTfConfigBytes) {
    return Malformed(absl::StrCat("is ", json.size(), " bytes, more than the ", kMaxTfConfigBytes,
                                  " a cluster description needs"));
  }
  PST_RETURN_IF_ERROR(CheckDepth(json));
  Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), &root);
  if (!parsed.ok()) {
    // protobuf's reason goes on to quote the text and point under it, on
    // lines of their own: its first line is the reason.
    const std::string reason = parsed.message().as_string();
    return Malformed(
        absl::StrCat("is not a JSON object (", reason.substr(0, reason.find('\n')), ")"));
  }
  static const std::set<std::string> kTopLevel = {"cluster", "task", "environment", "rpc_layer"};
  for (const auto& [key, value] : root.fields()) {
    if (kTopLevel.count(key) == 0) return Malformed(absl::StrCat("has an unknown key \"", key, "\""));
  }
  auto cluster_it = root.fields().find("cluster");
  if (cluster_it == root.fields().end() || cluster_it->second.kind_case() != Value::kStructValue) {
    return Malformed("has no \"cluster\" object");
  }
  const Struct& cluster = cluster_it->second.struct_value();
  static const std::set<std::string> kTaskTypes = {"ps", "worker", "chief", "master", "evaluator"};
  for (const auto& [type, addresses] : cluster.fields()) {
    if (kTaskTypes.count(type) == 0) {
      return Malformed(absl::StrCat("has cluster.", type,
                                    "; pstrain knows ps, chief (or master), worker and evaluator"));
    }
  }
  TfConfig config;
  PST_ASSIGN_OR_RETURN(config.ps, Addresses(cluster, "ps"));
  PST_ASSIGN_OR_RETURN(std::vector<std::string> chief, Addresses(cluster, "chief"));
  PST_ASSIGN_OR_RETURN(std::vector<std::string> master, Addresses(cluster, "master"));
  PST_ASSIGN_OR_RETURN(std::vector<std::string> workers, Addresses(cluster, "worker"));
  PST_RETURN_IF_ERROR(Addresses(cluster, "evaluator").status());
  if (chief.size() + master.size() > 1) {
    return Malformed("lists more than one chief (chief and master together); a cluster has one");
  }
  if (config.ps.empty()) {
    return Malformed("lists no ps task; pstrain needs at least one parameter server");
  }
  const int chiefs = static_cast<int>(chief.size() + master.size());
  config.workers = chiefs + static_cast<int>(workers.size());
  if (config.workers == 0) return Malformed("lists no chief or worker task");
  if (config.workers > kMaxWorkers ||
      static_cast<int>(config.ps.size()) > kMaxPsShards * replicas) {
    return Malformed(
        absl::StrCat("lists more than ", kMaxWorkers, " workers or ", kMaxPsShards, " ps shards"));
  }
  if (auto task_it = root.fields().find("task"); task_it != root.fields().end()) {
    PST_ASSIGN_OR_RETURN(config.task, ParseTaskObject(task_it->second, config, chiefs,
                                                      static_cast<int>(workers.size())));
  }
  PST_RETURN_IF_ERROR(SplitReplicas(replicas, kTfConfigVariable, &config));
  return config;
}

absl::StatusOr<std::optional<TfConfig>> TfConfigFromEnvironment() {
  const char* value = std::getenv(kTfConfigVariable);
  if (value == nullptr || *value == '\0') return std::optional<TfConfig>();
  const auto getenv = [](const char* name) { return std::getenv(name); };
  PST_ASSIGN_OR_RETURN(int replicas, ReplicasPerShard(getenv));
  PST_ASSIGN_OR_RETURN(TfConfig config, ParseTfConfig(value, replicas));
  PST_ASSIGN_OR_RETURN(config.etcd_endpoints, EtcdEndpoints(getenv));
  return std::optional<TfConfig>(std::move(config));
}

absl::StatusOr<std::optional<TfConfig>> ParseTorchEnvironment(
    const std::function<const char*(const char*)>& getenv) {
  const auto value = [&](const char* name) -> std::optional<std::string> {
    const char* text = getenv(name);
    if (text == nullptr || *text == '\0') return std::nullopt;
    return std::string(text);
  };
  const std::optional<std::string> listed = value("PSTRAIN_PS");
  const std::optional<std::string> master = value("MASTER_ADDR");
  const std::optional<std::string> world = value("WORLD_SIZE");
  if (!world || (!listed && !master)) return std::optional<TfConfig>();
  const auto number = [](const char* name, const std::string& text, int low,
                         int high) -> absl::StatusOr<int> {
    int n = 0;
    if (!absl::SimpleAtoi(text, &n) || n < low || n > high) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "=", text, " is not a whole number in [", low, ", ", high,
          "]; torchrun's environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT) with "
          "PSTRAIN_PS or PSTRAIN_NUM_PS describes the cluster"));
    }
    return n;
  };
  TfConfig torch;
  torch.source = "torchrun's environment (WORLD_SIZE, RANK, MASTER_ADDR, PSTRAIN_PS)";
  PST_ASSIGN_OR_RETURN(const int replicas, ReplicasPerShard(getenv));
  PST_ASSIGN_OR_RETURN(torch.etcd_endpoints, EtcdEndpoints(getenv));
  PST_ASSIGN_OR_RETURN(torch.workers, number("WORLD_SIZE", *world, 1, kMaxWorkers));
  if (const std::optional<std::string> rank = value("RANK")) {
    PST_ASSIGN_OR_RETURN(int index, number("RANK", *rank, 0, torch.workers - 1));
    torch.task = TaskId{TaskId::Kind::kWorker, index};
  }
  if (listed) {
    for (absl::string_view address : absl::StrSplit(*listed, ',')) {
      torch.ps.emplace_back(absl::StripAsciiWhitespace(address));
      if (!IsHostPort(torch.ps.back())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "PSTRAIN_PS=", *listed, " has \"", torch.ps.back(),
            "\", which is not host:port; list the shards as host:port,host:port"));
      }
    }
    PST_RETURN_IF_ERROR(SplitReplicas(replicas, "PSTRAIN_PS", &torch));
    return std::optional<TfConfig>(std::move(torch));
  }
  const std::optional<std::string> port_text = value("MASTER_PORT");
  if (!port_text) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR is set but MASTER_PORT is not; the shards listen at MASTER_PORT+1, ...: "
        "set MASTER_PORT (torchrun does), or list the shards in PSTRAIN_PS");
  }
  int shards = 1;
  if (const std::optional<std::string> n = value("PSTRAIN_NUM_PS")) {
    PST_ASSIGN_OR_RETURN(shards, number("PSTRAIN_NUM_PS", *n, 1, kMaxPsShards));
  }
  const int listed_count = shards * replicas;
  PST_ASSIGN_OR_RETURN(int port, number("MASTER_PORT", *port_text, 1, 65535 - listed_count));
  for (int j = 0; j < listed_count; ++j)
    torch.ps.push_back(absl::StrCat(*master, ":", port + 1 + j));
  PST_RETURN_IF_ERROR(SplitReplicas(replicas, "MASTER_PORT+1, ...", &torch));
  return std::optional<TfConfig>(std::move(torch));
}

absl::StatusOr<std::optional<TfConfig>> ClusterFromEnvironment() {
  PST_ASSIGN_OR_RETURN(std::optional<TfConfig> tf, TfConfigFromEnvironment());
  if (tf) return tf;
  return ParseTorchEnvironment([](const char* name) { return std::getenv(name); });
}

absl::Status ApplyTfConfig(const TfConfig& tf, absl::string_view origin, JobConfig* config) {
  ClusterConfig* cluster = config->mutable_cluster();
  if (cluster->ps_size() == 0) {
    for (const std::string& address : tf.ps) cluster->add_ps(address);
  } else if (std::vector<std::string>(cluster->ps().begin(), cluster->ps().end()) != tf.ps) {
    return absl::InvalidArgumentError(absl::StrCat(
        tf.source, " lists ps [", absl::StrJoin(tf.ps, ", "), "] but ", origin,
        " has cluster.ps [", absl::StrJoin(cluster->ps(), ", "),
        "]; remove cluster.ps from the config to take ", tf.source, "'s, or make them agree"));
  }
  if (!tf.ps_backups.empty()) {
    std::vector<std::vector<std::string>> configured;
    for (const PsBackups& backups : cluster->ps_backups()) {
      configured.emplace_back(backups.address().begin(), backups.address().end());
    }
    if (configured.empty()) {
      for (const std::vector<std::string>& backups : tf.ps_backups) {
        cluster->add_ps_backups()->mutable_address()->Assign(backups.begin(), backups.end());
      }
    } else if (configured != tf.ps_backups) {
      return absl::InvalidArgumentError(absl::StrCat(
          tf.source, " with ", kPsReplicasVariable, " lists other backups than ", origin,
          "'s cluster.ps_backups; remove cluster.ps_backups from the config to take ", tf.source,
          "'s, or make them agree"));
    }
  }
  Membership* membership = cluster->mutable_membership();
  if (membership->etcd_endpoints().empty()) {
    membership->mutable_etcd_endpoints()->Assign(tf.etcd_endpoints.begin(),
                                                 tf.etcd_endpoints.end());
  } else if (!tf.etcd_endpoints.empty() &&
             std::vector<std::string>(membership->etcd_endpoints().begin(),
                                      membership->etcd_endpoints().end()) != tf.etcd_endpoints) {
    return absl::InvalidArgumentError(absl::StrCat(
        kEtcdVariable, " lists [", absl::StrJoin(tf.etcd_endpoints, ", "), "] but ", origin,
        " has cluster.membership.etcd_endpoints [",
        absl::StrJoin(membership->etcd_endpoints(), ", "), "]; unset one, or make them agree"));
  }
  if (cluster->workers() == 0) {
    cluster->set_workers(tf.workers);
  } else if (cluster->workers() != tf.workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        tf.source, " lists ", tf.workers, " worker(s) (chief included) but ", origin,
        " (or --workers) has cluster.workers ", cluster->workers(),
        "; remove cluster.workers from the config to take ", tf.source,
        "'s, or make them agree"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TaskId> ResolveTask(absl::string_view task_flag, const std::optional<TfConfig>& tf,
                                   TaskId::Kind runs, absl::string_view program) {
  std::optional<TaskId> given;
  if (!task_flag.empty()) {
    PST_ASSIGN_OR_RETURN(given, ParseTask(task_flag));
  }
  const std::optional<TaskId> from_tf = tf.has_value() ? tf->task : std::nullopt;
  if (given && from_tf && *given != *from_tf) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--task=", task_flag, " but ", tf->source, "'s task is ", from_tf->ToString(),
        " (chief:0 is worker:0, worker:i is worker:i+1 after a chief); drop --task or make them "
        "agree"));
  }
  const TaskId task = given ? *given : from_tf ? *from_tf : TaskId{runs, 0};
  if (task.kind != runs) {
    const bool ps = runs == TaskId::Kind::kPs;
    return absl::InvalidArgumentError(absl::StrCat(
        given ? std::string("--task") : tf->source, " names task ", task.ToString(), " but ",
        program, " runs ", ps ? "ps:<index>" : "worker:<index>", " tasks; start ",
        ps ? "worker" : "ps_server", " for it"));
  }
  return task;
}

absl::StatusOr<TaskId> ResolveTaskFromEnvironment(absl::string_view task_flag, TaskId::Kind runs,
                                                  absl::string_view program) {
  PST_ASSIGN_OR_RETURN(std::optional<TfConfig> tf, ClusterFromEnvironment());
  // torchrun's RANK is a worker's rank, never a shard's.
  if (tf && tf->source != kTfConfigVariable && runs != TaskId::Kind::kWorker) tf->task.reset();
  return ResolveTask(task_flag, tf, runs, program);
}

absl::StatusOr<int> ResolveReplica(std::optional<int> replica_flag,
                                   const std::optional<TfConfig>& tf) {
  const bool from_tf = tf.has_value() && tf->task && tf->task->kind == TaskId::Kind::kPs;
  if (replica_flag && from_tf && *replica_flag != tf->replica) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica=", *replica_flag, " but ", tf->source, "'s task is replica ", tf->replica,
        " of shard ", tf->task->index, " (", kPsReplicasVariable,
        " lists the primaries first, then each shard's first backup, ...); drop --replica or "
        "make them agree"));
  }
  return replica_flag ? *replica_flag : from_tf ? tf->replica : 0;
}

absl::StatusOr<int> ResolveReplicaFromEnvironment(std::optional<int> replica_flag) {
  PST_ASSIGN_OR_RETURN(std::optional<TfConfig> tf, ClusterFromEnvironment());
  return ResolveReplica(replica_flag, tf);
}

absl::Status CheckTfConfigUnset(absl::string_view launcher) {
  const char* value = std::getenv(kTfConfigVariable);
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      kTfConfigVariable, " is set, which gives each process one task, but ", launcher,
      " starts every task itself; start ps_server or worker in each task's place instead (as "
      "deploy/kubeflow/tfjob.yaml does), or unset TF_CONFIG"));
}

}  // namespace pst
