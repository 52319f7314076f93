#include "pslaunch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pst {
namespace {

// A child that writes a longer line without a newline gets it cut here, so
// one chatty child cannot make the launcher buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the sink is gone; the children's output is lost, not fatal
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// The exit code of `pid` once it has exited (128 + N for signal N), or -1
// while it runs. WNOWAIT leaves it a zombie: its PID, and so its process
// group, cannot be reused until Collect(), which keeps signalling the group
// safe after the child itself is gone.
int PeekExit(pid_t pid, bool block) {
  siginfo_t info = {};
  int options = WEXITED | WNOWAIT | (block ? 0 : WNOHANG);
  int result;
  do {
    result = waitid(P_PID, static_cast<id_t>(pid), &info, options);
  } while (result < 0 && errno == EINTR);
  if (result < 0) return 1;  // ECHILD: reaped behind our back (SIGCHLD ignored); status unknown
  if (info.si_pid == 0) return -1;
  return info.si_code == CLD_EXITED ? info.si_status : 128 + info.si_status;
}

// Reaps a child that has exited, or is about to.
void Collect(pid_t pid) {
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

// In the forked child, so async-signal-safe calls only. Makes `fd` the
// descriptor `target`, without close-on-exec.
bool MoveFd(int fd, int target) {
  if (fd == target) return fcntl(fd, F_SETFD, 0) == 0;
  return dup2(fd, target) == target;
}

// In the forked child: never returns. On failure writes errno to
// `status_fd` (close-on-exec, so the parent reads EOF when exec succeeds).
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, pid_t parent, int out_fd,
                            int err_fd, int status_fd) {
  auto fail = [status_fd] {
    int error = errno;
    (void)!write(status_fd, &error, sizeof(error));
    _exit(127);
  };
  setpgid(0, 0);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail();
  if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
  // No stdin for children; a root without /dev (a bare chroot) gets a
  // closed descriptor instead.
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) {
    close(STDIN_FILENO);
  } else if (!MoveFd(devnull, STDIN_FILENO)) {
    fail();
  }
  if (!MoveFd(out_fd, STDOUT_FILENO) || !MoveFd(err_fd, STDERR_FILENO)) fail();
  // Ignored signals stay ignored across exec; handlers and the mask are
  // the launcher's business, not the child's.
  for (int signal_number : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGQUIT}) {
    signal(signal_number, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(argv[0], argv, envp);
  fail();
  _exit(127);  // not reached; fail() does not return
}

// The Supervisor that SIGINT/SIGTERM are routed to, and the handlers it replaced.
std::atomic<Supervisor*> g_signal_target{nullptr};
struct sigaction g_old_sigint, g_old_sigterm;

void OnStopSignal(int) {
  int saved_errno = errno;
  if (Supervisor* target = g_signal_target.load()) target->RequestStop();
  errno = saved_errno;
}

}  // namespace

Supervisor::Supervisor(int out_fd, int err_fd) : out_fd_(out_fd), err_fd_(err_fd) {
  if (pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) stop_pipe_[0] = stop_pipe_[1] = -1;
}

Supervisor::~Supervisor() {
  if (handles_signals_) {
    g_signal_target.store(nullptr);
    sigaction(SIGINT, &g_old_sigint, nullptr);
    sigaction(SIGTERM, &g_old_sigterm, nullptr);
  }
  bool all_collected = std::all_of(children_.begin(), children_.end(),
                                   [](const Child& child) { return child.collected; });
  if (!all_collected) StopAll(absl::Seconds(5));
  for (Child& child : children_) {
    CloseFd(child.out.fd);
    CloseFd(child.err.fd);
  }
  CloseFd(stop_pipe_[0]);
  CloseFd(stop_pipe_[1]);
}

absl::Status Supervisor::StopOnSignals() {
  Supervisor* expected = nullptr;
  if (!g_signal_target.compare_exchange_strong(expected, this)) {
    if (expected == this) return absl::OkStatus();
    return absl::FailedPreconditionError("another Supervisor already handles SIGINT/SIGTERM");
  }
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &g_old_sigint);
  sigaction(SIGTERM, &action, &g_old_sigterm);
  handles_signals_ = true;
  return absl::OkStatus();
}

absl::Status Supervisor::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError(spec.name + ": a child needs a command");
  if (stop_pipe_[0] < 0) return absl::InternalError("cannot create the supervisor's stop pipe");
  // Everything the child needs is prepared here: after fork it may not allocate.
  std::vector<char*> argv;
  for (const std::string& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  for (const std::string& arg : spec.first_start_args) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  // The launcher's environment, with spec.env's names replaced.
  std::vector<std::string> overridden;
  for (const std::string& entry : spec.env) overridden.push_back(entry.substr(0, entry.find('=') + 1));
  std::vector<char*> envp;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view variable(*entry);
    bool replaced = false;
    for (const std::string& name : overridden) replaced |= absl::StartsWith(variable, name);
    if (!replaced) envp.push_back(*entry);
  }
  for (const std::string& entry : spec.env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  int out[2], err[2], status[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "cannot create a pipe");
  if (pipe2(err, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0) {
    absl::Status error = absl::ErrnoToStatus(errno, "cannot create a pipe");
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return error;
  }
  // Signals stay blocked across fork so that no launcher handler runs in the
  // child before it has reset them.
  sigset_t all, old_mask;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old_mask);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) ExecChild(argv.data(), envp.data(), parent, out[1], err[1], status[1]);
  int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  for (int fd : {out[1], err[1], status[1]}) close(fd);
  if (pid < 0) {
    for (int fd : {out[0], err[0], status[0]}) close(fd);
    return absl::ErrnoToStatus(fork_errno, "fork failed");
  }
  setpgid(pid, pid);  // also here, so the group exists whatever the child got to

  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(status[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(status[0]);
  if (n == sizeof(exec_errno)) {
    Collect(pid);
    close(out[0]);
    close(err[0]);
    return absl::ErrnoToStatus(exec_errno, absl::StrCat("cannot run ", spec.argv[0]));
  }

  Child child;
  child.spec = spec;
  child.pid = pid;
  child.out.fd = out[0];
  child.err.fd = err[0];
  for (int fd : {out[0], err[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

void Supervisor::RequestStop() {
  char byte = 1;
  if (stop_pipe_[1] >= 0) (void)!write(stop_pipe_[1], &byte, 1);
}

bool Supervisor::AnyRunning() const {
  return std::any_of(children_.begin(), children_.end(),
                     [](const Child& child) { return child.running; });
}

bool Supervisor::AllMustFinishDone() const {
  return std::none_of(children_.begin(), children_.end(), [](const Child& child) {
    return child.spec.must_finish && child.running;
  });
}

const Supervisor::Child* Supervisor::FirstFailure() const {
  for (size_t index : exit_order_) {
    const Child& child = children_[index];
    if (child.exit_code != 0 || !child.spec.must_finish) return &child;
  }
  return nullptr;
}

std::vector<pid_t> Supervisor::pids() const {
  std::vector<pid_t> pids;
  for (const Child& child : children_) pids.push_back(child.pid);
  return pids;
}

void Supervisor::WriteLine(int sink, const std::string& name, const std::string& line) {
  // One write per line keeps lines whole when several children interleave.
  std::string prefixed = absl::StrCat("[", name, "] ", line, "\n");
  WriteAll(sink, prefixed.data(), prefixed.size());
}

void Supervisor::Drain(const Child& child, Stream& stream, int sink) {
  char buffer[65536];
  while (stream.fd >= 0) {
    ssize_t n = read(stream.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // EOF, or an error that ends the stream just the same
      if (!stream.partial.empty()) WriteLine(sink, child.spec.name, stream.partial);
      stream.partial.clear();
      CloseFd(stream.fd);
      return;
    }
    stream.partial.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline; (newline = stream.partial.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      WriteLine(sink, child.spec.name, stream.partial.substr(start, newline - start));
    }
    stream.partial.erase(0, start);
    if (stream.partial.size() >= kMaxLineBytes) {
      WriteLine(sink, child.spec.name, stream.partial);
      stream.partial.clear();
    }
  }
}

void Supervisor::FlushExited(bool close_all) {
  for (Child& child : children_) {
    if (child.running) continue;
    for (auto [stream, sink] : {std::pair{&child.out, out_fd_}, std::pair{&child.err, err_fd_}}) {
      Drain(child, *stream, sink);
      if (!close_all || stream->fd < 0) continue;
      if (!stream->partial.empty()) WriteLine(sink, child.spec.name, stream->partial);
      stream->partial.clear();
      CloseFd(stream->fd);
    }
  }
}

void Supervisor::Pump(absl::Duration timeout) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, Stream*>> owners;
  for (Child& child : children_) {
    for (Stream* stream : {&child.out, &child.err}) {
      if (stream->fd < 0) continue;
      fds.push_back({stream->fd, POLLIN, 0});
      owners.push_back({&child, stream});
    }
  }
  fds.push_back({stop_pipe_[0], POLLIN, 0});
  int ready = poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (ready > 0) {  // ready < 0 is EINTR: nothing to read, but reap below all the same
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [child, stream] = owners[i];
      Drain(*child, *stream, stream == &child->out ? out_fd_ : err_fd_);
    }
    if (fds.back().revents & POLLIN) ReadStopRequests();
  }
  Reap(/*block=*/false);
}

void Supervisor::ReadStopRequests() {
  char bytes[64];
  ssize_t n;
  while ((n = read(stop_pipe_[0], bytes, sizeof(bytes))) > 0) stop_requests_ += static_cast<int>(n);
}

bool Supervisor::StopRequested() {
  ReadStopRequests();
  return stop_requests_ > 0;
}

void Supervisor::Reap(bool block) {
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& child = children_[i];
    if (!child.running) continue;
    int code = PeekExit(child.pid, block);
    if (code < 0) continue;
    child.running = false;
    child.exit_code = code;
    exit_order_.push_back(i);
  }
}

absl::Status Supervisor::Restart(const std::string& name) {
  auto exited = std::find_if(exit_order_.begin(), exit_order_.end(),
                             [&](size_t i) { return children_[i].spec.name == name; });
  if (exited == exit_order_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no exited task called ", name));
  }
  Child& old = children_[*exited];
  exit_order_.erase(exited);
  kill(-old.pid, SIGKILL);
  Collect(old.pid);
  old.collected = true;
  FlushExited(/*close_all=*/false);
  ChildSpec spec = old.spec;  // copy: Start() may reallocate children_
  spec.first_start_args.clear();
  return Start(spec);
}

absl::Status Supervisor::Abandon(const std::string& name) {
  auto exited = std::find_if(exit_order_.begin(), exit_order_.end(),
                             [&](size_t i) { return children_[i].spec.name == name; });
  if (exited == exit_order_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no exited task called ", name));
  }
  Child& child = children_[*exited];
  exit_order_.erase(exited);
  child.spec.must_finish = false;
  kill(-child.pid, SIGKILL);  // whatever it left in its group
  Collect(child.pid);
  child.collected = true;
  FlushExited(/*close_all=*/false);
  return absl::OkStatus();
}

RunOutcome Supervisor::Run() {
  int stops_before = stop_requests_;
  while (true) {
    Pump(absl::Milliseconds(100));
    if (stop_requests_ > stops_before) return {RunOutcome::Kind::kStopRequested, "", 0};
    if (const Child* failed = FirstFailure()) {
      return {RunOutcome::Kind::kChildFailed, failed->spec.name, failed->exit_code};
    }
    if (AllMustFinishDone()) {
      FlushExited(/*close_all=*/false);  // their last lines, before the caller reports
      return {RunOutcome::Kind::kAllFinished, "", 0};
    }
  }
}

RunOutcome Supervisor::RunUntil(const std::function<bool()>& ready, absl::Duration timeout) {
  const int stops_before = stop_requests_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (ready()) return {RunOutcome::Kind::kReady, "", 0};
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return {RunOutcome::Kind::kTimedOut, "", 0};
    Pump(std::min(left, absl::Milliseconds(100)));
    if (stop_requests_ > stops_before) return {RunOutcome::Kind::kStopRequested, "", 0};
    if (const Child* failed = FirstFailure()) {
      return {RunOutcome::Kind::kChildFailed, failed->spec.name, failed->exit_code};
    }
  }
}

void Supervisor::SignalGroups(int signal_number) {
  for (const Child& child : children_) {
    if (child.collected) continue;
    // The group reaches the child's own children too, even after the child
    // itself exited (its zombie keeps the group ours). A running child that
    // left its group (setsid) is still ours by PID.
    if (kill(-child.pid, signal_number) != 0 && child.running) kill(child.pid, signal_number);
  }
}

void Supervisor::StopAll(absl::Duration grace) {
  int stops_before = stop_requests_;
  SignalGroups(SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  while (AnyRunning() && stop_requests_ == stops_before) {
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    Pump(std::min(left, absl::Milliseconds(50)));
  }
  // Also ends what is left in the groups of children that exited early.
  SignalGroups(SIGKILL);
  Reap(/*block=*/true);
  for (Child& child : children_) {
    if (child.collected) continue;
    Collect(child.pid);
    child.collected = true;
  }
  FlushExited(/*close_all=*/true);
}

}  // namespace pst
