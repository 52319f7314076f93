// Loading, overriding and validating the job config (proto/config.proto).
//
// Every binary is started the same way, `--config=FILE --task=ps:0`, and the
// command-line overrides (--mode, --epochs, ...) win over the file. Errors are
// one sentence naming the file and line, meant to be shown to the user as is.
#ifndef PST_COMMON_CONFIG_H_
#define PST_COMMON_CONFIG_H_

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "config.pb.h"

namespace pst {

// Bounds ValidateConfig enforces whatever the host: beyond them a config is a
// typo, not a job (a PS keeps state per worker, pslaunch a process per task).
inline constexpr int kMaxWorkers = 4096;
inline constexpr int kMaxPsShards = 1024;
// Parameters of the model, and floats of a generated data set: 1 GiB of
// float32 each, of which a worker and a PS keep several copies.
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 28;
// A config file is text of a few kilobytes; reading stops here.
inline constexpr int64_t kMaxConfigFileBytes = 16 << 20;

// Which process of the cluster this is: "ps:0", "worker:3".
struct TaskId {
  enum class Kind { kPs, kWorker };
  Kind kind = Kind::kWorker;
  int index = 0;

  std::string ToString() const;
  bool operator==(const TaskId&) const = default;
};

// The refusal of one config field, in the form every config check uses:
// InvalidArgument "config field <field> <problem>".
absl::Status InvalidConfigField(absl::string_view field, absl::string_view problem);

// InvalidArgument unless `text` is "ps:<n>" or "worker:<n>".
absl::StatusOr<TaskId> ParseTask(absl::string_view text);

// One command-line override of the config: the flag, its value as given,
// and how that value changes the config. The table in common/overrides.h
// makes them; LoadJobConfig applies them, in order, over the file.
struct ConfigOverride {
  std::string flag;   // without "--": "mode"
  std::string value;  // as on the command line: "async"
  std::function<absl::Status(absl::string_view value, JobConfig* config)> apply;
};
using ConfigOverrides = std::vector<ConfigOverride>;

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

// Applies each override; InvalidArgument "--<flag>: <why>" for the first
// value its override refuses.
absl::Status ApplyOverrides(const ConfigOverrides& overrides, JobConfig* config);

// "sync", "async" or "ssp", in any case; InvalidArgument naming the choices.
absl::StatusOr<Mode> ParseMode(absl::string_view text);

// Sets the learning rate of whichever optimizer is configured (SGD when none is).
void SetLearningRate(float learning_rate, OptimizerConfig* optimizer);

// Fills the documented defaults for unset fields (batch size, seed,
// optimizer hyperparameters, data directory, ...).
void ApplyDefaults(JobConfig* config);

// InvalidArgument naming the first field that is out of range. A config
// that names no model (training.model) is valid without a data set: its
// workers bring their own, as a cluster.worker_command script does.
absl::Status ValidateConfig(const JobConfig& config);
// InvalidArgument unless the config names the model the worker binary
// trains (training.model), or workers of its own (cluster.worker_command).
absl::Status CheckConfigNamesModel(const JobConfig& config);

// Inputs and outputs of the model for the configured data set (features,
// and classes or targets): {784, 10} for Fashion-MNIST.
std::pair<int64_t, int64_t> ModelEnds(const DatasetConfig& dataset);

// Trainable parameters of the model the config describes.
int64_t ModelParameterCount(const TrainingConfig& training);

// A stable hex digest of what decides the trained model: cluster shape, mode
// and its knobs, optimizer, model, data, batch size, epochs, seed, wire type.
// Addresses, security, timeouts and checkpoint settings are left out, so a
// task restarted under another host name still recognizes its run.
std::string TrainingConfigHash(const JobConfig& config);

// FailedPrecondition unless `dir` is, or can be created as, a directory this
// process may write into; checks without creating anything.
absl::Status CheckWritableDirectory(const std::string& dir, absl::string_view field);

// InvalidArgument unless every embedding table's storage.disk is, or can be
// created as, a directory this process may write into (what a PS checks
// at start, before it opens a table's disk tier there). With `create`,
// makes each directory and writes and removes a file in it, which is the
// only sure test; without, creates nothing (--check_config).
absl::Status CheckEmbeddingDisks(const JobConfig& config, bool create = false);

// One line describing a valid config: "N ps shard(s), M worker(s), sync mode, TLS + token".
std::string ConfigSummary(const JobConfig& config);

// Whether `address` ("host:port") names port 0: a PS given it binds a port
// the system picks (and may report it, ps_server --port_file).
bool HasPortZero(absl::string_view address);

// Whether a loaded config's cluster.ps may name port 0: only for the PS
// itself and its launcher; workers and psctl need the real ports.
enum class PsPorts { kGiven, kMayBeZero };

// Everything above in order: read `path` (or the embedded default when
// `path` is empty), override, default, validate.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                        const ConfigOverrides& overrides,
                                        PsPorts ps_ports = PsPorts::kGiven);

// InvalidArgument if the task does not exist in the cluster.
absl::Status ValidateTask(const JobConfig& config, const TaskId& task);

// What a PS does with the checkpoints it finds at start (--checkpoint_start):
//  kAuto:    restore this run's newest valid checkpoint; refuse to start when
//            the directory holds checkpoint files none of which is this
//            run's to restore (all invalid, another run's or job's, or a
//            finished run's); start fresh when it holds none.
//  kRestore: restore the newest valid checkpoint whatever run wrote it;
//            refuse when there is none, or when the config names the model
//            and the checkpoint holds another (other variables, tables or
//            table settings).
//  kRestoreOtherModel: as kRestore, whatever model the checkpoint holds.
//  kFresh:   ignore them (moved aside), start from the initial weights.
enum class CheckpointStart { kAuto, kRestore, kRestoreOtherModel, kFresh };
absl::StatusOr<CheckpointStart> ParseCheckpointStart(absl::string_view text);

// "sync" / "async" / "ssp".
std::string ModeName(Mode mode);

// The learning rate of whichever optimizer is configured.
float LearningRate(const OptimizerConfig& optimizer);

}  // namespace pst

#endif  // PST_COMMON_CONFIG_H_
