#include "common/config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/ctr_config.h"
#include "common/embedding_config.h"
#include "common/json_depth.h"
#include "common/optimizer_config.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/device_spec.h"

namespace pst {
namespace internal {
extern const std::string_view kEmbeddedDefaultConfig;
}  // namespace internal

namespace {

constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Keeps the first parse error with its position, 1-based as editors show it.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!has_error_) {
      has_error_ = true;
      error_ = absl::StrFormat("%d:%d: %s", line + 1, column + 1, message);
      message_ = message;
    }
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  const std::string& error() const { return error_; }
  const std::string& message() const { return message_; }

 private:
  bool has_error_ = false;
  std::string error_;
  std::string message_;
};

// The messages enclosing `target`, outermost first, ending with `target`;
// empty if `target` is not reachable from `from`.
std::vector<const google::protobuf::Descriptor*> PathTo(const google::protobuf::Descriptor* from,
                                                        const google::protobuf::Descriptor* target,
                                                        int depth = 0) {
  if (from == target) return {from};
  if (depth > 8) return {};
  for (int i = 0; i < from->field_count(); ++i) {
    const google::protobuf::Descriptor* child = from->field(i)->message_type();
    if (child == nullptr) continue;
    std::vector<const google::protobuf::Descriptor*> path = PathTo(child, target, depth + 1);
    if (!path.empty()) {
      path.insert(path.begin(), from);
      return path;
    }
  }
  return {};
}

// The parser reports a field after a missing '}' as unknown in the message
// left open: `Message type "pst.ClusterConfig" has no field named
// "training"`. When the field belongs to an enclosing message, say so.
std::string MissingBraceHint(absl::string_view message) {
  constexpr absl::string_view kType = "Message type \"", kField = "has no field named \"";
  size_t type_at = message.find(kType), field_at = message.find(kField);
  if (type_at == absl::string_view::npos || field_at == absl::string_view::npos) return "";
  absl::string_view type = message.substr(type_at + kType.size());
  type = type.substr(0, type.find('"'));
  absl::string_view field = message.substr(field_at + kField.size());
  field = field.substr(0, field.find('"'));
  const google::protobuf::Descriptor* open =
      google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(std::string(type));
  if (open == nullptr) return "";
  std::vector<const google::protobuf::Descriptor*> path = PathTo(JobConfig::descriptor(), open);
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    if (path[i]->FindFieldByName(std::string(field)) != nullptr) {
      return absl::StrCat(" (\"", field, "\" belongs to ", path[i]->full_name(),
                          ": is a closing } missing before it?)");
    }
  }
  return "";
}

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config field ", field, " ", problem));
}

absl::Status ValidateCluster(const ClusterConfig& cluster) {
  if (cluster.ps_size() == 0) {
    return Invalid("cluster.ps", "is empty; list at least one \"host:port\"");
  }
  if (cluster.ps_size() > kMaxPsShards) {
    return Invalid("cluster.ps", absl::StrCat("lists ", cluster.ps_size(), " shards, more than the ",
                                              kMaxPsShards, " a cluster may have"));
  }
  std::map<std::string, int> first_index;
  for (int i = 0; i < cluster.ps_size(); ++i) {
    const std::string& address = cluster.ps(i);
    size_t colon = address.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return Invalid(absl::StrCat("cluster.ps[", i, "]"),
                     absl::StrCat("\"", address, "\" is not \"host:port\""));
    }
    auto [first, inserted] = first_index.emplace(address, i);
    if (!inserted) {
      return Invalid(absl::StrCat("cluster.ps[", i, "]"),
                     absl::StrCat("\"", address, "\" is also cluster.ps[", first->second,
                                  "]; every shard needs its own address"));
    }
  }
  if (cluster.workers() < 1) return Invalid("cluster.workers", "must be at least 1");
  if (cluster.workers() > kMaxWorkers) {
    return Invalid("cluster.workers", absl::StrCat(cluster.workers(), " is more than the ",
                                                   kMaxWorkers, " a cluster may have"));
  }
  if (cluster.max_restarts() < 0) return Invalid("cluster.max_restarts", "must not be negative");
  if (cluster.has_tls() && cluster.tls().ca().empty()) {
    return Invalid("cluster.tls.ca", "is empty; name the PEM file of the CA that signed the PS certificates");
  }
  if (cluster.has_auth()) {
    const AuthConfig& auth = cluster.auth();
    if (auth.token_file().empty() == auth.token_env().empty()) {
      return Invalid("cluster.auth", "must set exactly one of token_file and token_env");
    }
    if (!cluster.has_tls()) {
      return Invalid("cluster.auth", "needs cluster.tls: a token sent in plaintext can be read on the way");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const TrainingConfig& training) {
  if (training.model().has_ctr() || training.dataset().has_ctr()) {
    PST_RETURN_IF_ERROR(ValidateCtrJob(training));
  } else if (!training.model().has_mlp()) {
    return Invalid("training.model", "must set mlp { ... } or ctr { ... }");
  }
  if (training.model().has_ctr()) {
    if (int64_t parameters = ModelParameterCount(training); parameters > kMaxModelParameters) {
      return Invalid("training.model.ctr", absl::StrCat(
          "makes a model of ", parameters, " dense parameters, more than the ",
          kMaxModelParameters, " (1 GiB of float32) a worker or PS holds; use fewer or narrower "
          "hidden layers"));
    }
    if (absl::StatusOr<std::vector<EmbeddingTableConfig>> tables =
            ResolveEmbeddingTables(training.model().embeddings(), training.optimizer());
        !tables.ok()) {
      return Invalid("training.model.embeddings", tables.status().message());
    }
    return absl::OkStatus();
  }
  const MlpConfig& mlp = training.model().mlp();
  for (int i = 0; i < mlp.hidden_size(); ++i) {
    if (mlp.hidden(i) < 1) {
      return Invalid(absl::StrCat("training.model.mlp.hidden[", i, "]"), "must be at least 1");
    }
  }
  if (!Activation_IsValid(mlp.activation())) {
    return Invalid("training.model.mlp.activation", "must be RELU or TANH");
  }
  if (!Loss_IsValid(mlp.loss())) {
    return Invalid("training.model.mlp.loss", "must be SOFTMAX_CROSS_ENTROPY or MSE");
  }
  if (int64_t parameters = ModelParameterCount(training); parameters > kMaxModelParameters) {
    return Invalid("training.model.mlp", absl::StrCat(
        "makes a model of ", parameters, " parameters, more than the ", kMaxModelParameters,
        " (1 GiB of float32) a worker or PS holds; use fewer or narrower hidden layers"));
  }
  bool classification = training.dataset().has_fashion_mnist();
  if (classification && mlp.loss() == MSE) {
    return Invalid("training.model.mlp.loss", "MSE does not fit a classification data set");
  }
  if (!classification && mlp.loss() == SOFTMAX_CROSS_ENTROPY) {
    return Invalid("training.model.mlp.loss",
                   "SOFTMAX_CROSS_ENTROPY needs a classification data set (fashion_mnist)");
  }
  if (absl::StatusOr<std::vector<EmbeddingTableConfig>> tables =
          ResolveEmbeddingTables(training.model().embeddings(), training.optimizer());
      !tables.ok()) {
    return Invalid("training.model.embeddings", tables.status().message());
  }
  return absl::OkStatus();
}

absl::Status ValidateDataset(const DatasetConfig& dataset) {
  switch (dataset.kind_case()) {
    case DatasetConfig::kFashionMnist:
      if (dataset.fashion_mnist().train_limit() < 0) {
        return Invalid("training.dataset.fashion_mnist.train_limit", "must not be negative");
      }
      return absl::OkStatus();
    case DatasetConfig::kQuadratic:
      if (dataset.quadratic().examples() < 1 ||
          dataset.quadratic().examples() > kMaxModelParameters / 4) {
        return Invalid("training.dataset.quadratic.examples",
                       absl::StrCat("must be between 1 and ", kMaxModelParameters / 4));
      }
      return absl::OkStatus();
    case DatasetConfig::kParabola:
      if (dataset.parabola().examples() < 1 ||
          dataset.parabola().examples() > kMaxModelParameters / 2) {
        return Invalid("training.dataset.parabola.examples",
                       absl::StrCat("must be between 1 and ", kMaxModelParameters / 2));
      }
      return absl::OkStatus();
    case DatasetConfig::kLinearRegression:
      if (dataset.linear_regression().examples() < 1 ||
          dataset.linear_regression().features() < 1) {
        return Invalid("training.dataset.linear_regression",
                       "needs examples and features of at least 1");
      }
      if (double{1.0} * dataset.linear_regression().examples() *
              (dataset.linear_regression().features() + 1) > kMaxModelParameters) {
        return Invalid("training.dataset.linear_regression",
                       absl::StrCat("examples x (features + 1) must be at most ",
                                    kMaxModelParameters, " floats (1 GiB)"));
      }
      return absl::OkStatus();
    case DatasetConfig::kCtr:  // checked with its model (common/ctr_config.h)
      return absl::OkStatus();
    case DatasetConfig::KIND_NOT_SET:
      break;
  }
  return Invalid("training.dataset",
                 "must name a data set: fashion_mnist, quadratic, parabola, linear_regression "
                 "or ctr");
}

absl::Status ValidateOptimizer(const OptimizerConfig& optimizer) {
  if (optimizer.kind_case() == OptimizerConfig::KIND_NOT_SET) {
    return Invalid("training.optimizer", "must set sgd, adam, adagrad or ftrl");
  }
  float lr = LearningRate(optimizer);
  if (!std::isfinite(lr) || lr <= 0) {
    return Invalid("training.optimizer learning_rate", "must be a positive number");
  }
  // Every PS builds its optimizer from what this resolves: whatever that
  // refuses (momentum, betas, epsilon, decay out of range) is refused at
  // load time.
  absl::StatusOr<OptimizerSettings> resolved = ResolveOptimizerConfig(optimizer);
  if (!resolved.ok()) return Invalid("training.optimizer", resolved.status().message());
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const CheckpointConfig& checkpoint) {
  const std::pair<const char*, int64_t> counts[] = {
      {"every_steps", checkpoint.every_steps()},
      {"every_seconds", checkpoint.every_seconds()},
      {"keep", checkpoint.keep()},
      {"max_failures", checkpoint.max_failures()}};
  for (const auto& [name, value] : counts) {
    if (value < 0) {
      return Invalid(absl::StrCat("training.checkpoint.", name),
                     absl::StrCat("is ", value, "; it must not be negative"));
    }
  }
  if (checkpoint.dir().empty() && (checkpoint.every_steps() > 0 || checkpoint.every_seconds() > 0)) {
    return Invalid("training.checkpoint.dir", "is empty, so no checkpoint would be written; "
                                              "name the directory for every_steps/every_seconds");
  }
  if (checkpoint.run_id().size() > 64 ||
      !std::all_of(checkpoint.run_id().begin(), checkpoint.run_id().end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
      })) {
    return Invalid("training.checkpoint.run_id",
                   "must be at most 64 letters, digits, '-', '_' or '.'");
  }
  return absl::OkStatus();
}

uint64_t Fnv1a(absl::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

bool IsVariableName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name.front())) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

std::string TaskId::ToString() const {
  return absl::StrCat(kind == Kind::kPs ? "ps" : "worker", ":", index);
}

absl::StatusOr<TaskId> ParseTask(absl::string_view text) {
  TaskId task;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "ps:")) {
    task.kind = TaskId::Kind::kPs;
  } else if (absl::ConsumePrefix(&rest, "worker:")) {
    task.kind = TaskId::Kind::kWorker;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("task \"", text, "\" must be ps:<index> or worker:<index>"));
  }
  if (!absl::SimpleAtoi(rest, &task.index) || task.index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("task \"", text, "\" has no valid index after the colon"));
  }
  return task;
}

absl::StatusOr<std::string> ExpandEnvironment(absl::string_view text, absl::string_view origin) {
  std::string out;
  out.reserve(text.size());
  int line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') ++line;
    if (c != '$' || i + 1 == text.size() || (text[i + 1] != '$' && text[i + 1] != '{')) {
      out.push_back(c);
      continue;
    }
    if (text[i + 1] == '$') {  // "$$" is a literal '$'
      out.push_back('$');
      ++i;
      continue;
    }
    size_t close = text.find('}', i + 2);
    absl::string_view body =
        close == absl::string_view::npos ? "" : text.substr(i + 2, close - i - 2);
    size_t dash = body.find(":-");
    absl::string_view name = body.substr(0, dash);
    if (close == absl::string_view::npos || !IsVariableName(name) ||
        body.substr(0, body.find('\n')) != body) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ":", line, ": \"${\" must start ${NAME} or ${NAME:-default} (write $$ for a "
          "literal $)"));
    }
    const char* value = std::getenv(std::string(name).c_str());
    if (value != nullptr && *value != '\0') {
      out.append(value);
    } else if (dash != absl::string_view::npos) {
      absl::StrAppend(&out, body.substr(dash + 2));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ":", line, ": environment variable ", name,
          " is not set; set it or give a default as ${", name, ":-value}"));
    }
    i = close;
  }
  return out;
}

namespace {

// A JSON config nests a few levels (common/json_depth.h says why it is
// bounded).
constexpr int kMaxJsonDepth = 32;

absl::Status CheckJsonDepth(absl::string_view json, absl::string_view origin) {
  if (std::optional<int> line = LineNestingBeyond(json, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ":", *line, ": invalid JSON config: nested more than ", kMaxJsonDepth,
        " levels deep; a job config nests a few objects (cluster, training, ...)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobConfig> ParseConfig(absl::string_view raw_text, absl::string_view origin) {
  JobConfig config;
  absl::StatusOr<std::string> expanded = ExpandEnvironment(raw_text, origin);
  if (!expanded.ok()) return expanded.status();
  absl::string_view text = *expanded;
  absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  if (!trimmed.empty() && trimmed.front() == '{') {
    PST_RETURN_IF_ERROR(CheckJsonDepth(trimmed, origin));
    auto status = google::protobuf::util::JsonStringToMessage(std::string(trimmed), &config);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": invalid JSON config: ", status.message().as_string()));
    }
    return config;
  }
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  if (!parser.Parse(&input, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", errors.error(), MissingBraceHint(errors.message())));
  }
  return config;
}

absl::StatusOr<JobConfig> ReadConfigFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config=", path, " is a directory; name the config file in it"));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path,
                                            "; check the --config path"));
  }
  // Bounded, so that a device (/dev/zero) or a huge file is refused, not read forever.
  std::string contents;
  char buffer[1 << 16];
  while (file.read(buffer, sizeof(buffer)) || file.gcount() > 0) {
    contents.append(buffer, static_cast<size_t>(file.gcount()));
    if (static_cast<int64_t>(contents.size()) > kMaxConfigFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config file ", path, " is larger than ", kMaxConfigFileBytes >> 20,
          " MiB; --config must name a cluster config"));
    }
  }
  if (file.bad()) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path, ": ",
                                            std::strerror(errno)));
  }
  return ParseConfig(contents, path);
}

absl::string_view EmbeddedDefaultConfig() {
  return {internal::kEmbeddedDefaultConfig.data(), internal::kEmbeddedDefaultConfig.size()};
}

absl::StatusOr<Mode> ParseMode(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "sync") return SYNC;
  if (lower == "async") return ASYNC;
  if (lower == "ssp") return SSP;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode \"", text, "\"; use sync, async or ssp"));
}

void SetLearningRate(float lr, OptimizerConfig* optimizer) {
  switch (optimizer->kind_case()) {
    case OptimizerConfig::kAdam: optimizer->mutable_adam()->set_learning_rate(lr); break;
    case OptimizerConfig::kAdagrad: optimizer->mutable_adagrad()->set_learning_rate(lr); break;
    case OptimizerConfig::kFtrl: optimizer->mutable_ftrl()->set_learning_rate(lr); break;
    case OptimizerConfig::kSgd:
    case OptimizerConfig::KIND_NOT_SET: optimizer->mutable_sgd()->set_learning_rate(lr); break;
  }
}

absl::Status ApplyOverrides(const ConfigOverrides& overrides, JobConfig* config) {
  for (const ConfigOverride& override : overrides) {
    if (absl::Status s = override.apply(override.value, config); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--", override.flag, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

void ApplyDefaults(JobConfig* config) {
  if (!config->cluster().has_max_restarts()) config->mutable_cluster()->set_max_restarts(3);
  TrainingConfig* training = config->mutable_training();
  if (training->mode() == MODE_UNSPECIFIED) training->set_mode(SYNC);
  if (training->batch_size() == 0) training->set_batch_size(64);
  if (training->epochs() == 0) training->set_epochs(1);
  if (training->seed() == 0) training->set_seed(1);
  if (training->pull_timeout_seconds() == 0) training->set_pull_timeout_seconds(120);
  if (training->log_every_steps() == 0) training->set_log_every_steps(100);
  if (training->lease_seconds() == 0) training->set_lease_seconds(5);
  if (training->dataset().has_fashion_mnist() && training->dataset().fashion_mnist().dir().empty()) {
    training->mutable_dataset()->mutable_fashion_mnist()->set_dir(kDefaultFashionMnistDir);
  }
}

absl::Status ValidateConfig(const JobConfig& config) {
  PST_RETURN_IF_ERROR(ValidateCluster(config.cluster()));
  const TrainingConfig& training = config.training();
  if (training.mode() != SYNC && training.mode() != ASYNC && training.mode() != SSP) {
    return Invalid("training.mode", absl::StrCat(training.mode(), " is not a mode; use SYNC, ASYNC or SSP"));
  }
  if (!WireDtype_IsValid(training.wire_dtype())) {
    return Invalid("training.wire_dtype",
                   absl::StrCat(training.wire_dtype(), " is not a type; use FP32, FP16 or BF16"));
  }
  if (training.batch_size() < 1) return Invalid("training.batch_size", "must be at least 1");
  if (training.epochs() < 1) return Invalid("training.epochs", "must be at least 1");
  if (training.pull_timeout_seconds() < 1) {
    return Invalid("training.pull_timeout_seconds", "must be at least 1");
  }
  if (training.staleness() < 0) return Invalid("training.staleness", "must not be negative");
  if (training.max_staleness() < 0) return Invalid("training.max_staleness", "must not be negative");
  if (training.replicas_to_aggregate() < 0 ||
      training.replicas_to_aggregate() > config.cluster().workers()) {
    return Invalid("training.replicas_to_aggregate",
                   absl::StrCat("must be between 0 (all) and cluster.workers (",
                                config.cluster().workers(), ")"));
  }
  // A worker heartbeats every lease / 4: shorter than 0.1 s, heartbeats
  // would crowd out the work; an endless lease never frees a dead worker.
  if (!(training.lease_seconds() >= 0.1f && training.lease_seconds() <= 86400.0f)) {
    return Invalid("training.lease_seconds",
                   "must be between 0.1 and 86400 (seconds; 0 for the default 5)");
  }
  if (absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(training.device()); !d.ok()) {
    return Invalid("training.device", d.status().message());
  }
  if (absl::StatusOr<DeviceList> d = ParseDeviceList(training.devices()); !d.ok()) {
    return Invalid("training.devices", d.status().message());
  } else if (!d->towers.empty() && training.batch_size() % static_cast<int>(d->towers.size()) != 0) {
    return Invalid("training.devices",
                   absl::StrCat("makes ", d->towers.size(),
                                " towers, which cannot split batch_size ", training.batch_size(),
                                " into equal slices; use a batch_size divisible by the towers"));
  }
  PST_RETURN_IF_ERROR(ValidateCheckpoint(training.checkpoint()));
  PST_RETURN_IF_ERROR(ValidateOptimizer(training.optimizer()));
  // A worker_command script brings its own model, and may bring its own data.
  if (!config.cluster().worker_command().empty()) {
    return training.has_dataset() ? ValidateDataset(training.dataset()) : absl::OkStatus();
  }
  PST_RETURN_IF_ERROR(ValidateDataset(training.dataset()));
  return ValidateModel(training);
}

std::pair<int64_t, int64_t> ModelEnds(const DatasetConfig& dataset) {
  switch (dataset.kind_case()) {
    case DatasetConfig::kFashionMnist: return {28 * 28, 10};
    case DatasetConfig::kQuadratic: return {3, 1};
    case DatasetConfig::kParabola: return {1, 1};
    case DatasetConfig::kLinearRegression: return {dataset.linear_regression().features(), 1};
    case DatasetConfig::kCtr:  // the CTR model's ends depend on its tables (common/ctr_config.h)
    case DatasetConfig::KIND_NOT_SET: break;
  }
  return {0, 0};
}

int64_t ModelParameterCount(const TrainingConfig& training) {
  if (training.model().has_ctr()) return CtrDenseParameterCount(training);
  const MlpConfig& mlp = training.model().mlp();
  auto [in, out] = ModelEnds(training.dataset());
  std::vector<int64_t> widths = {in};
  widths.insert(widths.end(), mlp.hidden().begin(), mlp.hidden().end());
  widths.push_back(out);
  // In double: absurd widths must not overflow into a small count.
  double parameters = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    parameters += static_cast<double>(widths[i]) * static_cast<double>(widths[i + 1]) +
                  (mlp.no_bias() ? 0 : static_cast<double>(widths[i + 1]));
  }
  return parameters >= 9e18 ? std::numeric_limits<int64_t>::max()
                            : static_cast<int64_t>(parameters);
}

std::string TrainingConfigHash(const JobConfig& config) {
  TrainingConfig training = config.training();
  training.clear_pull_timeout_seconds();
  training.clear_log_every_steps();
  training.clear_lease_seconds();
  training.clear_checkpoint();
  training.clear_device();
  training.clear_require_all_workers();
  if (training.dataset().has_fashion_mnist()) {
    training.mutable_dataset()->mutable_fashion_mnist()->clear_dir();
  }
  const std::string relevant =
      absl::StrCat("ps=", config.cluster().ps_size(), ";workers=", config.cluster().workers(),
                   ";", training.SerializeAsString());
  return absl::StrFormat("%016x", Fnv1a(relevant));
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

std::string ConfigSummary(const JobConfig& config) {
  const ClusterConfig& cluster = config.cluster();
  return absl::StrFormat("%d ps shard(s), %d worker(s), %s mode, %s%s", cluster.ps_size(),
                         cluster.workers(), ModeName(config.training().mode()),
                         !cluster.has_tls()                    ? "plaintext"
                         : cluster.tls().require_client_cert() ? "mutual TLS"
                                                               : "TLS",
                         cluster.has_auth() ? " + token" : "");
}

bool HasPortZero(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(address.substr(colon + 1), &port) && port == 0;
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                        const ConfigOverrides& overrides, PsPorts ps_ports) {
  absl::StatusOr<JobConfig> config =
      path.empty() ? ParseConfig(EmbeddedDefaultConfig(), "configs/local.textproto (built in)")
                   : ReadConfigFile(path);
  if (!config.ok()) return config.status();
  PST_RETURN_IF_ERROR(ApplyOverrides(overrides, &*config));
  PST_ASSIGN_OR_RETURN(std::optional<TfConfig> tf_config, TfConfigFromEnvironment());
  if (tf_config) {
    PST_RETURN_IF_ERROR(
        ApplyTfConfig(*tf_config, path.empty() ? "the built-in config" : path, &*config));
  }
  ApplyDefaults(&*config);
  // The check wants real ports (and distinct addresses): a port-0 address
  // is checked as a stand-in of its own, all else as given.
  JobConfig checked = *config;
  for (int i = 0; ps_ports == PsPorts::kMayBeZero && i < checked.cluster().ps_size(); ++i) {
    if (HasPortZero(checked.cluster().ps(i))) {
      checked.mutable_cluster()->set_ps(i, absl::StrCat("port-0-of-ps-", i, ":1"));
    }
  }
  if (absl::Status s = ValidateConfig(checked); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? "built-in config" : path, ": ", s.message()));
  }
  return config;
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

absl::StatusOr<CheckpointStart> ParseCheckpointStart(absl::string_view text) {
  if (text == "auto") return CheckpointStart::kAuto;
  if (text == "restore") return CheckpointStart::kRestore;
  if (text == "fresh") return CheckpointStart::kFresh;
  return absl::InvalidArgumentError(absl::StrCat(
      "--checkpoint_start=", text, " is not a choice; use auto, restore or fresh"));
}

std::string ModeName(Mode mode) {
  switch (mode) {
    case ASYNC: return "async";
    case SSP: return "ssp";
    case SYNC:
    default: return "sync";
  }
}

float LearningRate(const OptimizerConfig& optimizer) {
  switch (optimizer.kind_case()) {
    case OptimizerConfig::kSgd: return optimizer.sgd().learning_rate();
    case OptimizerConfig::kAdam: return optimizer.adam().learning_rate();
    case OptimizerConfig::kAdagrad: return optimizer.adagrad().learning_rate();
    case OptimizerConfig::kFtrl: return optimizer.ftrl().learning_rate();
    case OptimizerConfig::KIND_NOT_SET: break;
  }
  return 0.0f;
}

}  // namespace pst
