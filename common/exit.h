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

}  // namespace pst

#endif  // PST_COMMON_EXIT_H_
