// What the multi-process tests share: running a shipped binary under
// timeout(1) with its output captured, scratch files, and free loopback
// ports. ctest runs test binaries in parallel, so every path is unique to
// the calling process.
#ifndef PST_TESTS_SUPPORT_COMMANDS_H_
#define PST_TESTS_SUPPORT_COMMANDS_H_

#include <sys/types.h>

#include <string>

#include "absl/time/time.h"

namespace pst {

struct CommandResult {
  int exit_code = -1;  // 128 + signal for a command killed by a signal
  std::string out;
  std::string err;
};

// Runs `command` through the shell with no standard input, killed after
// `timeout_seconds` (and SIGKILLed 5 s later if it ignores SIGTERM).
CommandResult RunCommand(const std::string& command, int timeout_seconds);

// The value of "key" in a one-line JSON object as written ("\"text\"" for
// a string, the digits for a number), or "" if absent: what a test reads of
// a benchmark's --json row.
std::string JsonField(const std::string& line, const std::string& key);

// The whole file, or "" if it cannot be read.
std::string ReadFile(const std::string& path);

// A fresh directory of this test process's own, made on the first call.
std::string ScratchDir();

// A port on 127.0.0.1 that nothing listens on right now.
int FreePort();

// Waits up to `timeout` for process `pid` to end, without reaping it: true
// once it has exited or been killed (a zombie counts), or if no such process
// exists. Works for processes that are not our children too.
bool AwaitProcessEnd(pid_t pid, absl::Duration timeout);

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_COMMANDS_H_
