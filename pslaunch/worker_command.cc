#include "pslaunch/worker_command.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pst {

void RunWorkerCommand(const std::string& command, ChildSpec* task) {
  for (size_t i = 1; i < task->argv.size(); ++i) {
    const std::string& flag = task->argv[i];
    const size_t equals = flag.find('=');
    if (!absl::StartsWith(flag, "--") || equals == std::string::npos) continue;
    task->env.push_back(absl::StrCat("PSTRAIN_", absl::AsciiStrToUpper(flag.substr(2, equals - 2)),
                                     flag.substr(equals)));
  }
  task->argv = {"/bin/sh", "-c", command};
}

}  // namespace pst
