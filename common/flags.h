// Command-line flags shared by ps_server, worker and pslaunch, so that every
// process accepts the same overrides with the same spelling.
#ifndef PST_COMMON_FLAGS_H_
#define PST_COMMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/strings/string_view.h"
#include "common/config.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(int, epochs);
ABSL_DECLARE_FLAG(int, workers);
ABSL_DECLARE_FLAG(int, batch_size);
ABSL_DECLARE_FLAG(float, learning_rate);
ABSL_DECLARE_FLAG(int, staleness);
ABSL_DECLARE_FLAG(std::string, wire_dtype);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(bool, check_config);

namespace pst {

// Sets the usage text, makes --help list this project's flags (not
// Abseil's own), parses the command line and sets the log format. Returns
// the positional arguments. A malformed command line exits 2 with one line.
std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage);

// InvalidArgument naming the first unknown flag, flag without a value or
// value its flag cannot take. Abseil's parser reports these itself, but
// exits 1, which launchers take for a crash worth a restart.
absl::Status CheckCommandLine(int argc, char** argv);

// What --check_config checks beyond ValidateConfig: the files the PS tasks
// (`ps`) and the workers (`workers`) of this host would read or write at
// start (TLS files, the token, the checkpoint directory), with the errors
// those tasks would give.
absl::Status CheckTaskFiles(const JobConfig& config, bool ps, bool workers);

// Ends a --check_config run: "config OK: <summary>" on stdout and exit 0,
// or the error on stderr and exit 2.
[[noreturn]] void FinishConfigCheck(absl::string_view program, const JobConfig& config,
                                    const absl::Status& check);

// The overrides given by the flags above (a flag left at its default
// sentinel is not an override).
ConfigOverrides OverridesFromFlags();

// The override flags as "--name=value" arguments, for passing on to child
// processes; only the flags that were set.
std::vector<std::string> OverrideFlagsAsArgs();

// Loads the job config named by --config (or the embedded default) with the
// flag overrides applied.
absl::StatusOr<JobConfig> LoadJobConfigFromFlags(PsPorts ps_ports = PsPorts::kGiven);

}  // namespace pst

#endif  // PST_COMMON_FLAGS_H_
