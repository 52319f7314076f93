#include "pslaunch/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pst {
namespace {

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// In the forked child: never returns.
[[noreturn]] void ExecChild(const ChildSpec& spec, pid_t parent, int out_fd, int err_fd) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  std::vector<char*> argv;
  for (const std::string& arg : spec.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  std::string message = absl::StrCat("cannot run ", spec.argv[0], ": ", std::strerror(errno), "\n");
  WriteAll(STDERR_FILENO, message.data(), message.size());
  _exit(127);
}

}  // namespace

Supervisor::Supervisor(int out_fd, int err_fd) : out_fd_(out_fd), err_fd_(err_fd) {
  if (pipe2(stop_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) stop_pipe_[0] = stop_pipe_[1] = -1;
}

Supervisor::~Supervisor() {
  if (AnyRunning()) StopAll(absl::Seconds(5));
  for (Child& child : children_) {
    CloseFd(child.out.fd);
    CloseFd(child.err.fd);
  }
  CloseFd(stop_pipe_[0]);
  CloseFd(stop_pipe_[1]);
}

absl::Status Supervisor::Start(const ChildSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("a child needs a command");
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(std::strerror(errno));
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) ExecChild(spec, parent, out[1], err[1]);
  setpgid(pid, pid);  // also here, so the group exists before we ever signal it
  close(out[1]);
  close(err[1]);
  Child child;
  child.spec = spec;
  child.pid = pid;
  child.out.fd = out[0];
  child.err.fd = err[0];
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

void Supervisor::RequestStop() {
  char byte = 1;
  if (stop_pipe_[1] >= 0) (void)!write(stop_pipe_[1], &byte, 1);
}

bool Supervisor::AnyRunning() const {
  for (const Child& child : children_) {
    if (child.running) return true;
  }
  return false;
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

void Supervisor::Drain(Child& child, Stream& stream, int sink) {
  char buffer[65536];
  ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n < 0 && errno == EINTR) return;
  if (n <= 0) {  // EOF or error: flush what is left
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
  if (ready > 0) {
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        Child* child = owners[i].first;
        Stream* stream = owners[i].second;
        Drain(*child, *stream, stream == &child->out ? out_fd_ : err_fd_);
      }
    }
    if (fds.back().revents & POLLIN) {
      char bytes[64];
      while (read(stop_pipe_[0], bytes, sizeof(bytes)) > 0) {
      }
      stop_requested_ = true;
    }
  }
  Reap(/*block=*/false);
}

void Supervisor::Reap(bool block) {
  for (Child& child : children_) {
    if (!child.running) continue;
    int status = 0;
    pid_t done = waitpid(child.pid, &status, block ? 0 : WNOHANG);
    if (done == child.pid) {
      child.running = false;
      child.exit_code = ExitCodeOf(status);
    }
  }
}

RunOutcome Supervisor::Run() {
  while (true) {
    Pump(absl::Milliseconds(100));
    if (stop_requested_) return {RunOutcome::Kind::kStopRequested, "", 0};
    bool all_finished = true;
    for (const Child& child : children_) {
      if (child.running) {
        all_finished = all_finished && !child.spec.must_finish;
        continue;
      }
      if (child.exit_code != 0) {
        return {RunOutcome::Kind::kChildFailed, child.spec.name, child.exit_code};
      }
      if (!child.spec.must_finish) {  // a server that quit on its own
        return {RunOutcome::Kind::kChildFailed, child.spec.name, 1};
      }
    }
    if (all_finished) {
      // Let the finished children's last lines through before returning.
      for (Child& child : children_) {
        while (!child.running && (child.out.fd >= 0 || child.err.fd >= 0)) {
          Pump(absl::Milliseconds(10));
        }
      }
      return {RunOutcome::Kind::kAllFinished, "", 0};
    }
  }
}

void Supervisor::StopAll(absl::Duration grace) {
  for (const Child& child : children_) {
    if (child.running) kill(-child.pid, SIGTERM);
  }
  absl::Time deadline = absl::Now() + grace;
  while (AnyRunning() && absl::Now() < deadline) Pump(absl::Milliseconds(50));
  for (const Child& child : children_) {
    if (child.running) kill(-child.pid, SIGKILL);
  }
  Reap(/*block=*/true);
  // Output still buffered in the pipes after the exits.
  for (Child& child : children_) {
    while (child.out.fd >= 0) Drain(child, child.out, out_fd_);
    while (child.err.fd >= 0) Drain(child, child.err, err_fd_);
  }
}

}  // namespace pst
