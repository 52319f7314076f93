#include "common/exit.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace pst {

void ExitWithError(absl::string_view program, const absl::Status& status) {
  std::string message(status.message());
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(program.size()), program.data(),
               message.c_str());
  std::fflush(stderr);
  std::exit(kUsageErrorExitCode);
}

}  // namespace pst
