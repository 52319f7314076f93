// The command line of every program: the flags shared by ps_server, worker
// and pslaunch (--config, --check_config), the overrides table
// (common/overrides.h), parsing and --help.
#ifndef PST_COMMON_FLAGS_H_
#define PST_COMMON_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/strings/string_view.h"
#include "common/config.h"
#include "common/overrides.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(bool, check_config);

namespace pst {

// Every log line of ours, C++ program or Python worker: "12:34:56.789 info ...".
inline constexpr char kLogPattern[] = "%H:%M:%S.%e %^%l%$ %v";

// Sets the usage text, parses the command line of `program` and sets the
// log format. Returns the positional arguments. A malformed command line
// exits 2 with one line; --help (or --helpshort) prints the usage and the
// flags `program` takes (HelpText) and exits 0; --helpfull lists every
// flag linked in, Abseil's included.
std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage,
                                         Program program);

// InvalidArgument naming the first unknown flag (an override that
// `program` does not take included), flag without a value or value its
// flag cannot take. Abseil's parser reports these itself, but exits 1,
// which launchers take for a crash worth a restart.
absl::Status CheckCommandLine(int argc, char** argv, Program program);

// The --help text of `program`, called `name`: `usage`, then its own
// flags, then the overrides it takes, grouped by what they change.
std::string HelpText(absl::string_view name, absl::string_view usage, Program program);

// What --check_config checks beyond ValidateConfig: the files the PS tasks
// (`ps`) and the workers (`workers`) of this host would read or write at
// start (TLS files, the token, the checkpoint directory, the data set's
// files unless a worker command brings its own), with the errors those
// tasks would give.
absl::Status CheckTaskFiles(const JobConfig& config, bool ps, bool workers);

// Ends a --check_config run: "config OK: <summary>" on stdout and exit 0,
// or the error on stderr and exit 2.
[[noreturn]] void FinishConfigCheck(absl::string_view program, const JobConfig& config,
                                    const absl::Status& check);

// Loads the job config named by --config (or the embedded default) with the
// flag overrides applied.
absl::StatusOr<JobConfig> LoadJobConfigFromFlags(PsPorts ps_ports = PsPorts::kGiven);

}  // namespace pst

#endif  // PST_COMMON_FLAGS_H_
