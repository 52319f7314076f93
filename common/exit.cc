#include "common/exit.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace pst {

namespace {

[[noreturn]] void PrintAndExit(absl::string_view program, const absl::Status& status, int code) {
  std::string message(status.message());
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(program.size()), program.data(),
               message.c_str());
  std::fflush(stderr);
  std::exit(code);
}

}  // namespace

void ExitWithError(absl::string_view program, const absl::Status& status) {
  PrintAndExit(program, status, kUsageErrorExitCode);
}

int ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return kUsageErrorExitCode;
    default:
      return 1;
  }
}

void ExitWithStatus(absl::string_view program, const absl::Status& status) {
  PrintAndExit(program, status, ExitCodeFor(status));
}

}  // namespace pst
