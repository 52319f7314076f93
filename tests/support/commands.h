// What the multi-process tests share: running a shipped binary under
// timeout(1) with its output captured, or as a child process of the test's
// own, scratch files, and the port a
// ps_server bound to port 0 reports. ctest runs test binaries in parallel,
// so every path is unique to the calling process, and no test picks a PS's
// port: each PS binds port 0 and reports the port it got.
#ifndef PST_TESTS_SUPPORT_COMMANDS_H_
#define PST_TESTS_SUPPORT_COMMANDS_H_

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

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

// A fresh directory of this test process's own, made on the first call and
// removed when the process exits normally.
std::string ScratchDir();

// Waits up to `timeout` for process `pid` to end, without reaping it: true
// once it has exited or been killed (a zombie counts), or if no such process
// exists. Works for processes that are not our children too.
bool AwaitProcessEnd(pid_t pid, absl::Duration timeout);

// The port that a ps_server started with --port_file=`path` (and an
// address with port 0) got: waits up to `timeout` for it to write the file,
// giving up early once process `pid` has ended. 0 if it did not write it.
int AwaitPortFile(const std::string& path, pid_t pid, absl::Duration timeout = absl::Seconds(60));

// One child process running `argv` (argv[0] a path), its output appended
// to `log`, with `env` (name, value) added to its environment. The
// destructor, like Kill, SIGKILLs and reaps it if it still runs.
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log,
               const std::vector<std::pair<std::string, std::string>>& env = {});
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  void Signal(int signal_number);
  void Kill();
  // Exit code (128 + signal if killed), or -1 if it did not exit within
  // `timeout`.
  int Wait(absl::Duration timeout);

 private:
  pid_t pid_ = -1;
};

}  // namespace pst

#endif  // PST_TESTS_SUPPORT_COMMANDS_H_
