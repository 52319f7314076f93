#include "pslaunch/worker_command.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pst {

void RunWorkerCommand(const std::string& command, int workers, ChildSpec* task) {
  for (size_t i = 1; i < task->argv.size(); ++i) {
    const std::string& flag = task->argv[i];
    const size_t equals = flag.find('=');
    if (!absl::StartsWith(flag, "--") || equals == std::string::npos) continue;
    task->env.push_back(absl::StrCat("PSTRAIN_", absl::AsciiStrToUpper(flag.substr(2, equals - 2)),
                                     flag.substr(equals)));
  }
  const std::string rank = task->name.substr(task->name.find(':') + 1);
  for (const char* name : {"RANK", "LOCAL_RANK"}) task->env.push_back(absl::StrCat(name, "=", rank));
  for (const char* name : {"WORLD_SIZE", "LOCAL_WORLD_SIZE"}) {
    task->env.push_back(absl::StrCat(name, "=", workers));
  }
  task->argv = {"/bin/sh", "-c", command};
}

}  // namespace pst
