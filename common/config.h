// Loading, overriding and validating the job config (proto/config.proto).
//
// Every binary is started the same way, `--config=FILE --task=ps:0`, and the
// command-line overrides (--mode, --epochs, ...) win over the file. Errors are
// one sentence naming the file and line, meant to be shown to the user as is.
#ifndef PST_COMMON_CONFIG_H_
#define PST_COMMON_CONFIG_H_

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "config.pb.h"

namespace pst {

// Which process of the cluster this is: "ps:0", "worker:3".
struct TaskId {
  enum class Kind { kPs, kWorker };
  Kind kind = Kind::kWorker;
  int index = 0;

  std::string ToString() const;
  bool operator==(const TaskId&) const = default;
};

// InvalidArgument unless `text` is "ps:<n>" or "worker:<n>".
absl::StatusOr<TaskId> ParseTask(absl::string_view text);

// Values given on the command line; unset ones leave the config alone.
struct ConfigOverrides {
  std::optional<std::string> mode;  // "sync" or "async"
  std::optional<int> epochs;
  std::optional<int> workers;
  std::optional<int> batch_size;
  std::optional<float> learning_rate;
  std::optional<int> staleness;
  std::optional<std::string> wire_dtype;  // "fp32", "fp16" or "bf16"
  std::optional<std::string> device;      // "auto", "cpu" or "gpu:N"
  std::optional<std::string> devices;     // towers: "cpu:2", "gpu:0,gpu:1", ...
  std::optional<std::string> exchange;    // "layerwise" or "whole_model"
};

// Replaces ${NAME} with the environment variable NAME and ${NAME:-default}
// with NAME, or `default` when NAME is unset or empty; "$$" is a literal '$'.
// The same config file can so name hosts that only the environment knows
// (compose service names, Kubernetes pod DNS names). InvalidArgument naming
// the line if a variable without default is unset or a "${" is malformed.
absl::StatusOr<std::string> ExpandEnvironment(absl::string_view text, absl::string_view origin);

// Expands the environment (above), then parses protobuf text format, or
// JSON when the text starts with '{'.
// `origin` names the source in error messages ("configs/local.textproto").
absl::StatusOr<JobConfig> ParseConfig(absl::string_view text, absl::string_view origin);

// Reads and parses a config file; NotFound if it cannot be read.
absl::StatusOr<JobConfig> ReadConfigFile(const std::string& path);

// The built-in default job (configs/local.textproto, embedded at build time).
absl::string_view EmbeddedDefaultConfig();

absl::Status ApplyOverrides(const ConfigOverrides& overrides, JobConfig* config);

// Fills the documented defaults for unset fields (batch size, seed,
// optimizer hyperparameters, data directory, ...).
void ApplyDefaults(JobConfig* config);

// InvalidArgument naming the first field that is out of range.
absl::Status ValidateConfig(const JobConfig& config);

// Everything above in order: read `path` (or the embedded default when
// `path` is empty), override, default, validate.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                        const ConfigOverrides& overrides);

// InvalidArgument if the task does not exist in the cluster.
absl::Status ValidateTask(const JobConfig& config, const TaskId& task);

// "sync" / "async" / "ssp".
std::string ModeName(Mode mode);

// The learning rate of whichever optimizer is configured.
float LearningRate(const OptimizerConfig& optimizer);

}  // namespace pst

#endif  // PST_COMMON_CONFIG_H_
