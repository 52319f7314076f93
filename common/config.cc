#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/ctr_config.h"
#include "common/json_depth.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

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
    case OptimizerConfig::kAdamw: optimizer->mutable_adamw()->set_learning_rate(lr); break;
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
  training.clear_export_model();
  if (training.dataset().has_fashion_mnist()) {
    training.mutable_dataset()->mutable_fashion_mnist()->clear_dir();
  }
  const std::string relevant =
      absl::StrCat("ps=", config.cluster().ps_size(), ";workers=", config.cluster().workers(),
                   ";", training.SerializeAsString());
  return absl::StrFormat("%016x", Fnv1a(relevant));
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
  PST_ASSIGN_OR_RETURN(std::optional<TfConfig> tf_config, ClusterFromEnvironment());
  if (tf_config && path.empty()) {
    // The built-in config's cluster is a loopback stand-in: the launcher's
    // replaces it (flags may still set it, and must then agree).
    config->mutable_cluster()->clear_ps();
    config->mutable_cluster()->clear_workers();
    // torchrun starts scripts, which bring their own model: the shards take
    // the first Init rather than expect the built-in MLP.
    if (tf_config->source != kTfConfigVariable) {
      config->mutable_training()->clear_model();
      config->mutable_training()->clear_dataset();
    }
  }
  PST_RETURN_IF_ERROR(ApplyOverrides(overrides, &*config));
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
  for (int i = 0; ps_ports == PsPorts::kMayBeZero && i < checked.cluster().ps_backups_size(); ++i) {
    PsBackups* backups = checked.mutable_cluster()->mutable_ps_backups(i);
    for (int k = 0; k < backups->address_size(); ++k) {
      if (HasPortZero(backups->address(k))) {
        backups->set_address(k, absl::StrCat("port-0-of-ps-", i, "-replica-", k + 1, ":1"));
      }
    }
  }
  if (absl::Status s = ValidateConfig(checked); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.empty() ? "built-in config" : path, ": ", s.message()));
  }
  return config;
}

absl::StatusOr<CheckpointStart> ParseCheckpointStart(absl::string_view text) {
  if (text == "auto") return CheckpointStart::kAuto;
  if (text == "restore") return CheckpointStart::kRestore;
  if (text == "restore_other_model") return CheckpointStart::kRestoreOtherModel;
  if (text == "fresh") return CheckpointStart::kFresh;
  return absl::InvalidArgumentError(
      absl::StrCat("--checkpoint_start=", text,
                   " is not a choice; use auto, restore, restore_other_model or fresh"));
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
    case OptimizerConfig::kAdamw: return optimizer.adamw().learning_rate();
    case OptimizerConfig::kAdagrad: return optimizer.adagrad().learning_rate();
    case OptimizerConfig::kFtrl: return optimizer.ftrl().learning_rate();
    case OptimizerConfig::KIND_NOT_SET: break;
  }
  return 0.0f;
}

}  // namespace pst
