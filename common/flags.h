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

namespace pst {

// Sets the usage text, makes --help list this project's flags (not
// Abseil's own), parses the command line and sets the log format. Returns
// the positional arguments.
std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage);

// The overrides given by the flags above (a flag left at its default
// sentinel is not an override).
ConfigOverrides OverridesFromFlags();

// The override flags as "--name=value" arguments, for passing on to child
// processes; only the flags that were set.
std::vector<std::string> OverrideFlagsAsArgs();

// Loads the job config named by --config (or the embedded default) with the
// flag overrides applied.
absl::StatusOr<JobConfig> LoadJobConfigFromFlags();

}  // namespace pst

#endif  // PST_COMMON_FLAGS_H_
