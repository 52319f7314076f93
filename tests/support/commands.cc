#include "tests/support/commands.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/support/eventually.h"
#include "tests/support/fresh_dir.h"

namespace pst {

CommandResult RunCommand(const std::string& command, int timeout_seconds) {
  static int calls = 0;
  const std::string stem = absl::StrCat(ScratchDir(), "/cmd.", ++calls);
  const std::string out = stem + ".out", err = stem + ".err";
  const std::string line = absl::StrCat("timeout -k 5 ", timeout_seconds, " ", command, " >",
                                        out, " 2>", err, " </dev/null");
  const int status = std::system(line.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFile(out);
  result.err = ReadFile(err);
  return result;
}

std::string JsonField(const std::string& line, const std::string& key) {
  std::smatch match;
  const std::regex pattern("\"" + key + "\":(\"[^\"]*\"|[^,}]*)");
  return std::regex_search(line, match, pattern) ? match[1].str() : "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string ScratchDir() {
  static const std::string dir = [] {
    std::string d = FreshScratchDir("pst_test");
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

bool AwaitProcessEnd(pid_t pid, absl::Duration timeout) {
  // A pidfd becomes readable when its process ends. (Through syscall():
  // glibc 2.36's <sys/pidfd.h> declares pidfd_open without C linkage.)
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  const absl::Time deadline = absl::Now() + timeout;
  pollfd ended = {.fd = fd, .events = POLLIN, .revents = 0};
  int ready;
  do {
    const int64_t ms =
        absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)));
    ready = poll(&ended, 1, static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30)));
  } while (ready < 0 && errno == EINTR);
  close(fd);
  return ready > 0;
}

int AwaitPortFile(const std::string& path, pid_t pid, absl::Duration timeout) {
  int port = 0;
  Eventually(
      [&] {
        // Whether it has ended, before reading: a file it wrote before it
        // ended is still read. The file is renamed into place whole.
        const bool ended = AwaitProcessEnd(pid, absl::ZeroDuration());
        std::string text = ReadFile(path);
        if (!text.empty() && text.back() == '\n') text.pop_back();
        if (!absl::SimpleAtoi(text, &port) || port <= 0) port = 0;
        return port > 0 || ended;
      },
      timeout, absl::Milliseconds(10));
  return port;
}

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& log,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  pid_ = fork();
  if (pid_ == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
}

void ChildProcess::Signal(int signal_number) {
  if (pid_ > 0) kill(pid_, signal_number);
}

void ChildProcess::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

int ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0 || !AwaitProcessEnd(pid_, timeout)) return -1;
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) return -1;
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace pst
