// Starts child processes and supervises them: streams their output line by
// line with a "[name] " prefix, notices when they exit, and stops them all.
//
// Knows nothing of configs or training; pslaunch/main.cc decides what to
// start. Children get their own process group (so a terminal's Ctrl-C
// reaches only the launcher, which then stops them in order) and die with
// the launcher even if it is killed (PR_SET_PDEATHSIG).
#ifndef PST_PSLAUNCH_SUPERVISOR_H_
#define PST_PSLAUNCH_SUPERVISOR_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pst {

struct ChildSpec {
  std::string name;               // "worker:1"; prefixes its output lines
  std::vector<std::string> argv;  // argv[0] is the executable's path
  // The run is complete when every child with must_finish has exited 0;
  // the others (servers) are expected to run until stopped.
  bool must_finish = true;
};

struct RunOutcome {
  enum class Kind { kAllFinished, kChildFailed, kStopRequested };
  Kind kind = Kind::kAllFinished;
  std::string failed_child;  // kChildFailed: its name
  int exit_code = 0;         // kChildFailed: its exit code, 128 + N for signal N
};

class Supervisor {
 public:
  // Prefixed stdout lines go to `out_fd`, stderr lines to `err_fd`.
  Supervisor(int out_fd, int err_fd);
  // Stops whatever is still running (SIGTERM, then SIGKILL after 5 s).
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Forks and execs the child. Internal error if a pipe or fork fails; an
  // exec failure shows as the child exiting with code 127.
  absl::Status Start(const ChildSpec& spec);

  // Streams output and reaps children until every must_finish child has
  // exited 0, some child failed (non-zero exit, death by signal, or a server
  // exiting on its own), or RequestStop() was called.
  RunOutcome Run();

  // Makes Run() return kStopRequested. Async-signal-safe: call it from a
  // signal handler or another thread.
  void RequestStop();

  // SIGTERM to every running child's process group; SIGKILL to those still
  // alive after `grace`. Keeps streaming their output meanwhile and returns
  // once every child has been reaped.
  void StopAll(absl::Duration grace);

  // PIDs of the children started, in start order (running or not).
  std::vector<pid_t> pids() const;

 private:
  struct Stream {
    int fd = -1;
    std::string partial;  // bytes after the last newline
  };
  struct Child {
    ChildSpec spec;
    pid_t pid = -1;
    Stream out, err;
    bool running = true;
    int exit_code = 0;
  };

  // Waits up to `timeout` for output, copies complete lines, reaps exits.
  void Pump(absl::Duration timeout);
  void Drain(Child& child, Stream& stream, int sink);
  void Reap(bool block);
  void WriteLine(int sink, const std::string& name, const std::string& line);
  bool AnyRunning() const;

  int out_fd_, err_fd_;
  int stop_pipe_[2] = {-1, -1};
  bool stop_requested_ = false;
  std::vector<Child> children_;
};

}  // namespace pst

#endif  // PST_PSLAUNCH_SUPERVISOR_H_
