// How a binary reports a fatal user-facing error: one line on stderr, exit 2.
#ifndef PST_COMMON_EXIT_H_
#define PST_COMMON_EXIT_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace pst {

// Exit code for a bad config, bad flags, missing data or unreachable peers.
inline constexpr int kUsageErrorExitCode = 2;

// Prints "<program>: error: <message>" to stderr and exits with code 2.
[[noreturn]] void ExitWithError(absl::string_view program, const absl::Status& status);

// The exit code for a run that ended with `status`: 2 where starting again
// would fail the same way (a bad config or argument, a wrong token, a model
// too large to allocate, a peer with another config), 1 where it may not (a
// peer unreachable or gone, a timeout). Launchers restart only the latter.
int ExitCodeFor(const absl::Status& status);

// As ExitWithError, with ExitCodeFor(status).
[[noreturn]] void ExitWithStatus(absl::string_view program, const absl::Status& status);

}  // namespace pst

#endif  // PST_COMMON_EXIT_H_
