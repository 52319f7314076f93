// Starts child processes and supervises them: streams their output line by
// line with a "[name] " prefix, notices when they exit, and stops them all.
//
// Knows nothing of configs or training; pslaunch/main.cc decides what to
// start. Typical use:
//
//   Supervisor supervisor(STDOUT_FILENO, STDERR_FILENO);
//   supervisor.StopOnSignals();                 // Ctrl-C ends Run()
//   supervisor.Start({"ps:0", {...}, /*must_finish=*/false});
//   supervisor.Start({"worker:0", {...}});
//   RunOutcome outcome = supervisor.Run();
//   supervisor.StopAll(absl::Seconds(10));     // always: stops the servers
//
// Each child gets its own process group, so a terminal's Ctrl-C reaches only
// the launcher, which then stops the children in order, and signals reach a
// child's own children too. Children die with the launcher even if it is
// killed (PR_SET_PDEATHSIG). The Supervisor only ever signals or waits for
// the PIDs it started itself.
//
// Not thread-safe: one thread calls Start, Run and StopAll; only
// RequestStop may be called from elsewhere.
#ifndef PST_PSLAUNCH_SUPERVISOR_H_
#define PST_PSLAUNCH_SUPERVISOR_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pst {

struct ChildSpec {
  std::string name;               // "worker:1"; prefixes its output lines
  std::vector<std::string> argv;  // argv[0] is the executable's path (no PATH search)
  // The run is complete when every child with must_finish has exited 0;
  // the others (servers) are expected to run until stopped, so one exiting
  // on its own, even with code 0, ends the run as a failure.
  bool must_finish = true;
  // Appended to argv on the first start only, not on Restart(): choices
  // that must not be repeated when a task is started again.
  std::vector<std::string> first_start_args = {};
  // "NAME=value" entries set in the child's environment (over the
  // launcher's own), never on its command line, where `ps` would show them.
  std::vector<std::string> env = {};
};

struct RunOutcome {
  // kReady and kTimedOut: only from RunUntil().
  enum class Kind { kAllFinished, kChildFailed, kStopRequested, kReady, kTimedOut };
  Kind kind = Kind::kAllFinished;
  std::string failed_child;  // kChildFailed: the first child that failed
  // kChildFailed: its exit code, 128 + N for death by signal N; 0 for a
  // server (must_finish == false) that exited cleanly but too early.
  int exit_code = 0;
};

class Supervisor {
 public:
  // Prefixed stdout lines of the children go to `out_fd`, their stderr lines
  // to `err_fd`; one write() per line, so lines stay whole. Both descriptors
  // stay owned by the caller and must remain open while the Supervisor lives.
  Supervisor(int out_fd, int err_fd);
  // StopAll(5 s) unless StopAll() already ran since the last Start(); restores
  // the signal handlers StopOnSignals() replaced.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Forks and execs the child, with stdin from /dev/null and stdout/stderr
  // piped back to this Supervisor. Returns once the exec has succeeded:
  // NotFound or PermissionDenied ("cannot run <path>: ...") when it failed,
  // Internal when a pipe or fork fails; a child that failed to start is
  // already reaped. Children die when the calling *thread* exits
  // (PR_SET_PDEATHSIG), so call it from the thread that supervises.
  absl::Status Start(const ChildSpec& spec);

  // Starts again the child called `name`, which Run() reported as failed:
  // what it left in its process group is killed, it is collected, and a new
  // process runs the same command under the same name. FailedPrecondition if
  // no exited child has that name; otherwise as Start().
  absl::Status Restart(const std::string& name);

  // Streams output and reaps children until every must_finish child has
  // exited 0 (kAllFinished, after copying their last output), some child
  // failed (kChildFailed), or a stop was requested (kStopRequested). Leaves
  // the remaining children running: follow it with StopAll().
  RunOutcome Run();

  // As Run(), but for a wait on the children's side effects (a file they
  // write): returns kReady once `ready()` holds, checked after each batch
  // of output and at least every 100 ms, kTimedOut if it still does not
  // after `timeout`, or as Run() when a child failed or a stop was
  // requested first. Unlike Run(), it does not end when every must_finish
  // child is done, so it can wait on servers alone.
  RunOutcome RunUntil(const std::function<bool()>& ready, absl::Duration timeout);

  // Gives up on the child called `name`, which Run() reported as failed:
  // Run() neither reports it again nor waits for it. FailedPrecondition if
  // no exited child has that name.
  absl::Status Abandon(const std::string& name);

  // Makes Run() return kStopRequested, and a StopAll() in progress skip the
  // rest of its grace period. Async-signal-safe: call it from a signal
  // handler or another thread.
  void RequestStop();

  // Whether a stop was requested since this Supervisor was made, for a
  // caller between Start()s (starting many tasks takes a while) that must
  // not make a stop wait for the rest.
  bool StopRequested();

  // Routes SIGINT and SIGTERM to RequestStop() until this Supervisor is
  // destroyed. FailedPrecondition if another live Supervisor already did.
  absl::Status StopOnSignals();

  // SIGTERM to the process group of every child; SIGKILL to the groups after
  // `grace`, or once every child has exited, or at once after a further
  // RequestStop() (so what a child left behind in its group dies too).
  // Keeps streaming their output meanwhile, and returns once every child has
  // been reaped and its output flushed, partial last lines included. Always
  // call it after Run(): exited children stay zombies until then, which
  // keeps their PIDs and process groups from being reused by strangers.
  void StopAll(absl::Duration grace);

  // PIDs of the children started, in start order (running or not).
  std::vector<pid_t> pids() const;

 private:
  struct Stream {
    int fd = -1;          // read end of the child's pipe, non-blocking
    std::string partial;  // bytes after the last newline
  };
  struct Child {
    ChildSpec spec;
    pid_t pid = -1;
    Stream out, err;
    bool running = true;     // false once it exited (it may still be a zombie)
    bool collected = false;  // reaped: its PID is no longer ours
    int exit_code = 0;
  };

  // Counts the stop requests waiting in the stop pipe.
  void ReadStopRequests();
  // Waits up to `timeout` for output or a stop request, copies complete
  // lines, then reaps the children that exited.
  void Pump(absl::Duration timeout);
  // Reads what `stream` holds now; at EOF flushes the partial line and closes.
  void Drain(const Child& child, Stream& stream, int sink);
  // Drains every stream of exited children; `close_all` also flushes and
  // closes the streams still held open (by a grandchild that escaped).
  void FlushExited(bool close_all);
  // Notes the exits of children, leaving them zombies until StopAll().
  void Reap(bool block);
  // To the process group of every child not yet collected.
  void SignalGroups(int signal);
  void WriteLine(int sink, const std::string& name, const std::string& line);
  bool AnyRunning() const;
  bool AllMustFinishDone() const;
  const Child* FirstFailure() const;

  int out_fd_, err_fd_;
  int stop_pipe_[2] = {-1, -1};
  int stop_requests_ = 0;  // stop requests seen by Pump so far
  bool handles_signals_ = false;
  std::vector<Child> children_;
  std::vector<size_t> exit_order_;  // indices into children_, in the order reaped
};

}  // namespace pst

#endif  // PST_PSLAUNCH_SUPERVISOR_H_
