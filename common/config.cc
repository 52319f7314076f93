#include "common/config.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/device_spec.h"
#include "kernels/optimizer.h"

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
    }
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
  const std::string& error() const { return error_; }

 private:
  bool has_error_ = false;
  std::string error_;
};

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
    case OptimizerConfig::kSgd:
    case OptimizerConfig::KIND_NOT_SET: optimizer->mutable_sgd()->set_learning_rate(lr); break;
  }
}

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("config field ", field, " ", problem));
}

absl::Status ValidateCluster(const ClusterConfig& cluster) {
  if (cluster.ps_size() == 0) {
    return Invalid("cluster.ps", "is empty; list at least one \"host:port\"");
  }
  for (int i = 0; i < cluster.ps_size(); ++i) {
    const std::string& address = cluster.ps(i);
    size_t colon = address.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 || port > 65535) {
      return Invalid(absl::StrCat("cluster.ps[", i, "]"),
                     absl::StrCat("\"", address, "\" is not \"host:port\""));
    }
  }
  if (cluster.workers() < 1) return Invalid("cluster.workers", "must be at least 1");
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
  if (!training.model().has_mlp()) return Invalid("training.model", "must set mlp { ... }");
  const MlpConfig& mlp = training.model().mlp();
  for (int i = 0; i < mlp.hidden_size(); ++i) {
    if (mlp.hidden(i) < 1) {
      return Invalid(absl::StrCat("training.model.mlp.hidden[", i, "]"), "must be at least 1");
    }
  }
  bool classification = training.dataset().has_fashion_mnist();
  if (classification && mlp.loss() == MSE) {
    return Invalid("training.model.mlp.loss", "MSE does not fit a classification data set");
  }
  if (!classification && mlp.loss() == SOFTMAX_CROSS_ENTROPY) {
    return Invalid("training.model.mlp.loss",
                   "SOFTMAX_CROSS_ENTROPY needs a classification data set (fashion_mnist)");
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
      if (dataset.quadratic().examples() < 1) {
        return Invalid("training.dataset.quadratic.examples", "must be at least 1");
      }
      return absl::OkStatus();
    case DatasetConfig::kParabola:
      if (dataset.parabola().examples() < 1) {
        return Invalid("training.dataset.parabola.examples", "must be at least 1");
      }
      return absl::OkStatus();
    case DatasetConfig::kLinearRegression:
      if (dataset.linear_regression().examples() < 1 ||
          dataset.linear_regression().features() < 1) {
        return Invalid("training.dataset.linear_regression",
                       "needs examples and features of at least 1");
      }
      return absl::OkStatus();
    case DatasetConfig::KIND_NOT_SET:
      break;
  }
  return Invalid("training.dataset",
                 "must name a data set: fashion_mnist, quadratic, parabola or linear_regression");
}

absl::Status ValidateOptimizer(const OptimizerConfig& optimizer) {
  if (optimizer.kind_case() == OptimizerConfig::KIND_NOT_SET) {
    return Invalid("training.optimizer", "must set sgd, adam or adagrad");
  }
  float lr = LearningRate(optimizer);
  if (!std::isfinite(lr) || lr <= 0) {
    return Invalid("training.optimizer learning_rate", "must be a positive number");
  }
  // Every PS builds its optimizer from this config: whatever that refuses
  // (momentum, betas, epsilon, decay out of range) is refused at load time.
  absl::StatusOr<std::unique_ptr<Optimizer>> built = MakeOptimizer(optimizer);
  if (!built.ok()) return Invalid("training.optimizer", built.status().message());
  return absl::OkStatus();
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

absl::StatusOr<JobConfig> ParseConfig(absl::string_view raw_text, absl::string_view origin) {
  JobConfig config;
  absl::StatusOr<std::string> expanded = ExpandEnvironment(raw_text, origin);
  if (!expanded.ok()) return expanded.status();
  absl::string_view text = *expanded;
  absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  if (!trimmed.empty() && trimmed.front() == '{') {
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
    return absl::InvalidArgumentError(absl::StrCat(origin, ":", errors.error()));
  }
  return config;
}

absl::StatusOr<JobConfig> ReadConfigFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path,
                                            "; check the --config path"));
  }
  std::stringstream contents;
  contents << file.rdbuf();
  return ParseConfig(contents.str(), path);
}

absl::string_view EmbeddedDefaultConfig() {
  return {internal::kEmbeddedDefaultConfig.data(), internal::kEmbeddedDefaultConfig.size()};
}

absl::Status ApplyOverrides(const ConfigOverrides& overrides, JobConfig* config) {
  TrainingConfig* training = config->mutable_training();
  if (overrides.mode) {
    absl::StatusOr<Mode> mode = ParseMode(*overrides.mode);
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--mode: ", mode.status().message()));
    training->set_mode(*mode);
  }
  if (overrides.epochs) training->set_epochs(*overrides.epochs);
  if (overrides.workers) config->mutable_cluster()->set_workers(*overrides.workers);
  if (overrides.batch_size) training->set_batch_size(*overrides.batch_size);
  if (overrides.learning_rate) SetLearningRate(*overrides.learning_rate, training->mutable_optimizer());
  if (overrides.staleness) training->set_staleness(*overrides.staleness);
  if (overrides.wire_dtype) {
    WireDtype dtype;
    if (!WireDtype_Parse(absl::AsciiStrToUpper(*overrides.wire_dtype), &dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--wire_dtype: unknown type \"", *overrides.wire_dtype, "\"; use fp32, fp16 or bf16"));
    }
    training->set_wire_dtype(dtype);
  }
  if (overrides.device) {
    if (absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(*overrides.device); !d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--device: ", d.status().message()));
    }
    training->set_device(*overrides.device);
  }
  if (overrides.devices) {
    if (absl::StatusOr<DeviceList> d = ParseDeviceList(*overrides.devices); !d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--devices: ", d.status().message()));
    }
    training->set_devices(*overrides.devices);
  }
  if (overrides.exchange) {
    ExchangeSchedule schedule;
    if (!ExchangeSchedule_Parse(absl::AsciiStrToUpper(*overrides.exchange), &schedule)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--exchange_schedule: unknown schedule \"", *overrides.exchange, "\"; use layerwise or whole_model"));
    }
    training->set_exchange(schedule);
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
  if (absl::Status s = ValidateCluster(config.cluster()); !s.ok()) return s;
  const TrainingConfig& training = config.training();
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
  if (!(training.lease_seconds() > 0)) return Invalid("training.lease_seconds", "must be positive");
  if (absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(training.device()); !d.ok()) {
    return Invalid("training.device", d.status().message());
  }
  if (absl::StatusOr<DeviceList> d = ParseDeviceList(training.devices()); !d.ok()) {
    return Invalid("training.devices", d.status().message());
  } else if (!d->towers.empty() && training.batch_size() % static_cast<int>(d->towers.size()) != 0) {
    return Invalid("training.devices",
                   absl::StrCat(d->towers.size(), " towers cannot split batch_size ",
                                training.batch_size(),
                                " into equal slices; use a batch_size divisible by the towers"));
  }
  if (absl::Status s = ValidateOptimizer(training.optimizer()); !s.ok()) return s;
  if (absl::Status s = ValidateDataset(training.dataset()); !s.ok()) return s;
  return ValidateModel(training);
}

absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                        const ConfigOverrides& overrides) {
  absl::StatusOr<JobConfig> config =
      path.empty() ? ParseConfig(EmbeddedDefaultConfig(), "configs/local.textproto (built in)")
                   : ReadConfigFile(path);
  if (!config.ok()) return config.status();
  if (absl::Status s = ApplyOverrides(overrides, &*config); !s.ok()) return s;
  ApplyDefaults(&*config);
  if (absl::Status s = ValidateConfig(*config); !s.ok()) {
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
    case OptimizerConfig::KIND_NOT_SET: break;
  }
  return 0.0f;
}

}  // namespace pst
