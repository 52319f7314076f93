// The checks ValidateConfig, ValidateTask and CheckWritableDirectory make
// (common/config.h): each refusal names its field and what to do.
#include "common/config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ctr_config.h"
#include "common/embedding_config.h"
#include "common/optimizer_config.h"
#include "common/status_macros.h"
#include "kernels/device_spec.h"

namespace pst {

absl::Status InvalidConfigField(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config field ", field, " ", problem));
}
namespace {

absl::Status ValidateCluster(const ClusterConfig& cluster) {
  if (cluster.ps_size() == 0) {
    return InvalidConfigField("cluster.ps", "is empty; list at least one \"host:port\"");
  }
  if (cluster.ps_size() > kMaxPsShards) {
    return InvalidConfigField("cluster.ps",
                              absl::StrCat("lists ", cluster.ps_size(), " shards, more than the ",
                                           kMaxPsShards, " a cluster may have"));
  }
  std::map<std::string, int> first_index;
  for (int i = 0; i < cluster.ps_size(); ++i) {
    const std::string& address = cluster.ps(i);
    size_t colon = address.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return InvalidConfigField(absl::StrCat("cluster.ps[", i, "]"),
                                absl::StrCat("\"", address, "\" is not \"host:port\""));
    }
    auto [first, inserted] = first_index.emplace(address, i);
    if (!inserted) {
      return InvalidConfigField(absl::StrCat("cluster.ps[", i, "]"),
                                absl::StrCat("\"", address, "\" is also cluster.ps[", first->second,
                                             "]; every shard needs its own address"));
    }
  }
  if (cluster.ps_backups_size() > 0) {
    if (cluster.ps_backups_size() != cluster.ps_size()) {
      return InvalidConfigField(
          "cluster.ps_backups",
          absl::StrCat("has ", cluster.ps_backups_size(), " entries for ", cluster.ps_size(),
                       " shards; give every shard its backups, or none"));
    }
    const int count = cluster.ps_backups(0).address_size();
    for (int i = 0; i < cluster.ps_backups_size(); ++i) {
      const PsBackups& backups = cluster.ps_backups(i);
      if (backups.address_size() != count || count == 0) {
        return InvalidConfigField(absl::StrCat("cluster.ps_backups[", i, "]"),
                                  absl::StrCat("lists ", backups.address_size(),
                                               " addresses; every shard needs the same ",
                                               "number of backups, at least one"));
      }
      for (int k = 0; k < count; ++k) {
        const std::string field = absl::StrCat("cluster.ps_backups[", i, "].address[", k, "]");
        const std::string& address = backups.address(k);
        const size_t colon = address.rfind(':');
        int port = 0;
        if (colon == std::string::npos || colon == 0 ||
            !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
          return InvalidConfigField(field, absl::StrCat("\"", address, "\" is not \"host:port\""));
        }
        auto [first, inserted] = first_index.emplace(address, i);
        if (!inserted) {
          return InvalidConfigField(
              field, absl::StrCat("\"", address, "\" is taken already (by ", "shard ",
                                  first->second, "); every replica needs its own address"));
        }
      }
    }
  }
  const Membership& membership = cluster.membership();
  for (int i = 0; i < membership.etcd_endpoints_size(); ++i) {
    const std::string& endpoint = membership.etcd_endpoints(i);
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return InvalidConfigField(
          absl::StrCat("cluster.membership.etcd_endpoints[", i, "]"),
          absl::StrCat("\"", endpoint, "\" is not \"host:port\" (etcd's client endpoint)"));
    }
  }
  if (membership.etcd_endpoints_size() > 0 && cluster.ps_backups_size() == 0) {
    return InvalidConfigField("cluster.membership",
                              "names etcd, but no shard has backups (cluster.ps_backups) to "
                              "take over; list them, or leave membership out");
  }
  for (char c : membership.job()) {
    if (c == '/' || absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return InvalidConfigField(
          "cluster.membership.job",
          absl::StrCat("\"", membership.job(), "\" has a '/' or a space; it names etcd keys"));
    }
  }
  if (membership.has_lease_seconds() && membership.lease_seconds() < 1) {
    return InvalidConfigField("cluster.membership.lease_seconds", "must be at least 1");
  }
  if (cluster.workers() < 1) return InvalidConfigField("cluster.workers", "must be at least 1");
  if (cluster.workers() > kMaxWorkers) {
    return InvalidConfigField(
        "cluster.workers",
        absl::StrCat(cluster.workers(), " is more than the ", kMaxWorkers, " a cluster may have"));
  }
  if (cluster.max_restarts() < 0)
    return InvalidConfigField("cluster.max_restarts", "must not be negative");
  if (cluster.has_tls() && cluster.tls().ca().empty()) {
    return InvalidConfigField(
        "cluster.tls.ca", "is empty; name the PEM file of the CA that signed the PS certificates");
  }
  if (cluster.has_auth()) {
    const AuthConfig& auth = cluster.auth();
    if (auth.token_file().empty() == auth.token_env().empty()) {
      return InvalidConfigField("cluster.auth", "must set exactly one of token_file and token_env");
    }
    if (!cluster.has_tls()) {
      return InvalidConfigField(
          "cluster.auth", "needs cluster.tls: a token sent in plaintext can be read on the way");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const TrainingConfig& training) {
  if (training.model().has_ctr() && !training.export_model().empty()) {
    return InvalidConfigField(
        "training.export_model",
        "is for the MLP: the worker does not hold a CTR model's embedding tables; export that "
        "model from its checkpoints with psctl export --checkpoint=training.checkpoint.dir");
  }
  if (training.model().has_ctr() || training.dataset().has_ctr()) {
    PST_RETURN_IF_ERROR(ValidateCtrJob(training));
  } else if (!training.model().has_mlp()) {
    return InvalidConfigField("training.model", "must set mlp { ... } or ctr { ... }");
  }
  if (training.model().has_ctr()) {
    if (int64_t parameters = ModelParameterCount(training); parameters > kMaxModelParameters) {
      return InvalidConfigField(
          "training.model.ctr",
          absl::StrCat("makes a model of ", parameters, " dense parameters, more than the ",
                       kMaxModelParameters,
                       " (1 GiB of float32) a worker or PS holds; use fewer or narrower "
                       "hidden layers"));
    }
    if (absl::StatusOr<std::vector<EmbeddingTableConfig>> tables =
            ResolveEmbeddingTables(training.model().embeddings(), training.optimizer());
        !tables.ok()) {
      return InvalidConfigField("training.model.embeddings", tables.status().message());
    }
    return absl::OkStatus();
  }
  const MlpConfig& mlp = training.model().mlp();
  for (int i = 0; i < mlp.hidden_size(); ++i) {
    if (mlp.hidden(i) < 1) {
      return InvalidConfigField(absl::StrCat("training.model.mlp.hidden[", i, "]"),
                                "must be at least 1");
    }
  }
  if (!Activation_IsValid(mlp.activation())) {
    return InvalidConfigField("training.model.mlp.activation", "must be RELU or TANH");
  }
  if (!Loss_IsValid(mlp.loss())) {
    return InvalidConfigField("training.model.mlp.loss", "must be SOFTMAX_CROSS_ENTROPY or MSE");
  }
  if (int64_t parameters = ModelParameterCount(training); parameters > kMaxModelParameters) {
    return InvalidConfigField(
        "training.model.mlp",
        absl::StrCat(
            "makes a model of ", parameters, " parameters, more than the ", kMaxModelParameters,
            " (1 GiB of float32) a worker or PS holds; use fewer or narrower hidden layers"));
  }
  bool classification = training.dataset().has_fashion_mnist();
  if (classification && mlp.loss() == MSE) {
    return InvalidConfigField("training.model.mlp.loss",
                              "MSE does not fit a classification data set");
  }
  if (!classification && mlp.loss() == SOFTMAX_CROSS_ENTROPY) {
    return InvalidConfigField(
        "training.model.mlp.loss",
        "SOFTMAX_CROSS_ENTROPY needs a classification data set (fashion_mnist)");
  }
  // The built-in MLP worker trains dense variables only; its shards check
  // each Init against that model, so they would refuse any table.
  if (training.model().embeddings_size() > 0) {
    return InvalidConfigField(
        "training.model.embeddings",
        absl::StrCat("declares ", training.model().embeddings_size(),
                     " table(s), but the built-in mlp model trains none; remove them, use "
                     "model { ctr { ... } }, or bring a model of your own with "
                     "cluster.worker_command"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDataset(const DatasetConfig& dataset) {
  switch (dataset.kind_case()) {
    case DatasetConfig::kFashionMnist:
      if (dataset.fashion_mnist().train_limit() < 0) {
        return InvalidConfigField("training.dataset.fashion_mnist.train_limit",
                                  "must not be negative");
      }
      return absl::OkStatus();
    case DatasetConfig::kQuadratic:
      if (dataset.quadratic().examples() < 1 ||
          dataset.quadratic().examples() > kMaxModelParameters / 4) {
        return InvalidConfigField("training.dataset.quadratic.examples",
                                  absl::StrCat("must be between 1 and ", kMaxModelParameters / 4));
      }
      return absl::OkStatus();
    case DatasetConfig::kParabola:
      if (dataset.parabola().examples() < 1 ||
          dataset.parabola().examples() > kMaxModelParameters / 2) {
        return InvalidConfigField("training.dataset.parabola.examples",
                                  absl::StrCat("must be between 1 and ", kMaxModelParameters / 2));
      }
      return absl::OkStatus();
    case DatasetConfig::kLinearRegression:
      if (dataset.linear_regression().examples() < 1 ||
          dataset.linear_regression().features() < 1) {
        return InvalidConfigField("training.dataset.linear_regression",
                                  "needs examples and features of at least 1");
      }
      if (double{1.0} * dataset.linear_regression().examples() *
              (dataset.linear_regression().features() + 1) > kMaxModelParameters) {
        return InvalidConfigField("training.dataset.linear_regression",
                                  absl::StrCat("examples x (features + 1) must be at most ",
                                               kMaxModelParameters, " floats (1 GiB)"));
      }
      return absl::OkStatus();
    case DatasetConfig::kCtr:  // checked with its model (common/ctr_config.h)
      return absl::OkStatus();
    case DatasetConfig::KIND_NOT_SET:
      break;
  }
  return InvalidConfigField(
      "training.dataset",
      "must name a data set: fashion_mnist, quadratic, parabola, linear_regression "
      "or ctr");
}

absl::Status ValidateOptimizer(const OptimizerConfig& optimizer) {
  if (optimizer.kind_case() == OptimizerConfig::KIND_NOT_SET) {
    return InvalidConfigField("training.optimizer", "must set sgd, adam, adamw, adagrad or ftrl");
  }
  float lr = LearningRate(optimizer);
  if (!std::isfinite(lr) || lr <= 0) {
    return InvalidConfigField("training.optimizer learning_rate", "must be a positive number");
  }
  // Every PS builds its optimizer from what this resolves: whatever that
  // refuses (momentum, betas, epsilon, decay out of range) is refused at
  // load time.
  absl::StatusOr<OptimizerSettings> resolved = ResolveOptimizerConfig(optimizer);
  if (!resolved.ok()) return InvalidConfigField("training.optimizer", resolved.status().message());
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const CheckpointConfig& checkpoint) {
  const std::pair<const char*, int64_t> counts[] = {
      {"every_steps", checkpoint.every_steps()},
      {"every_seconds", checkpoint.every_seconds()},
      {"keep", checkpoint.keep()},
      {"max_failures", checkpoint.max_failures()},
      {"full_every", checkpoint.full_every()}};
  for (const auto& [name, value] : counts) {
    if (value < 0) {
      return InvalidConfigField(absl::StrCat("training.checkpoint.", name),
                                absl::StrCat("is ", value, "; it must not be negative"));
    }
  }
  if (checkpoint.dir().empty() && (checkpoint.every_steps() > 0 || checkpoint.every_seconds() > 0)) {
    return InvalidConfigField("training.checkpoint.dir",
                              "is empty, so no checkpoint would be written; "
                              "name the directory for every_steps/every_seconds");
  }
  if (checkpoint.run_id().size() > 64 ||
      !std::all_of(checkpoint.run_id().begin(), checkpoint.run_id().end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
      })) {
    return InvalidConfigField("training.checkpoint.run_id",
                              "must be at most 64 letters, digits, '-', '_' or '.'");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateConfig(const JobConfig& config) {
  PST_RETURN_IF_ERROR(ValidateCluster(config.cluster()));
  const TrainingConfig& training = config.training();
  if (training.mode() != SYNC && training.mode() != ASYNC && training.mode() != SSP) {
    return InvalidConfigField(
        "training.mode", absl::StrCat(training.mode(), " is not a mode; use SYNC, ASYNC or SSP"));
  }
  if (!WireDtype_IsValid(training.wire_dtype())) {
    return InvalidConfigField(
        "training.wire_dtype",
        absl::StrCat(training.wire_dtype(), " is not a type; use FP32, FP16 or BF16"));
  }
  if (training.batch_size() < 1)
    return InvalidConfigField("training.batch_size", "must be at least 1");
  if (training.epochs() < 1) return InvalidConfigField("training.epochs", "must be at least 1");
  if (training.pull_timeout_seconds() < 1) {
    return InvalidConfigField("training.pull_timeout_seconds", "must be at least 1");
  }
  if (training.staleness() < 0)
    return InvalidConfigField("training.staleness", "must not be negative");
  if (training.max_staleness() < 0)
    return InvalidConfigField("training.max_staleness", "must not be negative");
  if (training.replicas_to_aggregate() < 0 ||
      training.replicas_to_aggregate() > config.cluster().workers()) {
    return InvalidConfigField("training.replicas_to_aggregate",
                              absl::StrCat("must be between 0 (all) and cluster.workers (",
                                           config.cluster().workers(), ")"));
  }
  // A worker heartbeats every lease / 4: shorter than 0.1 s, heartbeats
  // would crowd out the work; an endless lease never frees a dead worker.
  if (!(training.lease_seconds() >= 0.1f && training.lease_seconds() <= 86400.0f)) {
    return InvalidConfigField("training.lease_seconds",
                              "must be between 0.1 and 86400 (seconds; 0 for the default 5)");
  }
  if (absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(training.device()); !d.ok()) {
    return InvalidConfigField("training.device", d.status().message());
  }
  if (absl::StatusOr<DeviceList> d = ParseDeviceList(training.devices()); !d.ok()) {
    return InvalidConfigField("training.devices", d.status().message());
  } else if (!d->towers.empty() && training.batch_size() % static_cast<int>(d->towers.size()) != 0) {
    return InvalidConfigField(
        "training.devices",
        absl::StrCat("makes ", d->towers.size(), " towers, which cannot split batch_size ",
                     training.batch_size(),
                     " into equal slices; use a batch_size divisible by the towers"));
  }
  PST_RETURN_IF_ERROR(ValidateCheckpoint(training.checkpoint()));
  PST_RETURN_IF_ERROR(ValidateOptimizer(training.optimizer()));
  // A worker_command script brings its own model, and may bring its own
  // data; so does any client of a config that names no model (a script
  // against hand-started shards, pstrain.Client). CheckConfigNamesModel is
  // for the worker binary, which trains the config's.
  if (!config.cluster().worker_command().empty() ||
      training.model().kind_case() == ModelConfig::KIND_NOT_SET) {
    return training.has_dataset() ? ValidateDataset(training.dataset()) : absl::OkStatus();
  }
  PST_RETURN_IF_ERROR(ValidateDataset(training.dataset()));
  return ValidateModel(training);
}

absl::Status CheckConfigNamesModel(const JobConfig& config) {
  if (!config.cluster().worker_command().empty() ||
      config.training().model().kind_case() != ModelConfig::KIND_NOT_SET) {
    return absl::OkStatus();
  }
  return InvalidConfigField(
      "training.model",
      "names no model, which the worker binary trains: name one (model { mlp { ... } } or "
      "model { ctr { ... } }, with a training.dataset), or run your own script as the workers "
      "(cluster.worker_command; pstrain.Client and pstrain.torch)");
}

absl::Status CheckWritableDirectory(const std::string& dir, absl::string_view field) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path path = fs::absolute(dir, error);
  if (error) path = dir;
  fs::path existing = path;
  while (!fs::exists(existing, error) && existing.has_parent_path() &&
         existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  const bool is_target = existing == path;
  auto problem = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config field ", field, " ", dir, is_target ? " " : " cannot be created: ", what,
        "; choose a directory this process can write"));
  };
  if (!fs::is_directory(existing, error)) {
    return problem(absl::StrCat(is_target ? "is" : existing.string() + " is", " not a directory"));
  }
  if (access(existing.c_str(), W_OK | X_OK) != 0) {
    return problem(absl::StrCat(is_target ? "is" : existing.string() + " is",
                                " not writable (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckEmbeddingDisks(const JobConfig& config, bool create) {
  const auto& tables = config.training().model().embeddings();
  for (int i = 0; i < tables.size(); ++i) {
    const std::string& disk = tables[i].storage().disk();
    if (disk.empty()) continue;
    const std::string field = absl::StrCat("training.model.embeddings[", i, "].storage.disk");
    if (absl::Status s = CheckWritableDirectory(disk, field); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    if (!create) continue;
    // Permission bits do not tell everything (root passes them on a
    // read-only file system): make the directory and a file in it.
    auto refused = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field ", field, " ", disk, ": ", what,
          "; choose a directory this process can write"));
    };
    std::error_code error;
    std::filesystem::create_directories(disk, error);
    if (error) return refused(absl::StrCat("cannot be created (", error.message(), ")"));
    const std::filesystem::path probe =
        std::filesystem::path(disk) / absl::StrCat(".pstrain-probe-", getpid());
    FILE* file = std::fopen(probe.c_str(), "w");
    if (file == nullptr) {
      return refused(absl::StrCat("is not writable (", std::strerror(errno), ")"));
    }
    std::fclose(file);
    std::filesystem::remove(probe, error);
  }
  return absl::OkStatus();
}

absl::Status ValidateTask(const JobConfig& config, const TaskId& task) {
  int count = task.kind == TaskId::Kind::kPs ? config.cluster().ps_size()
                                             : config.cluster().workers();
  if (task.index >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task ", task.ToString(), " does not exist: the cluster has ", count,
        task.kind == TaskId::Kind::kPs ? " ps shard(s)" : " worker(s)"));
  }
  return absl::OkStatus();
}

}  // namespace pst
