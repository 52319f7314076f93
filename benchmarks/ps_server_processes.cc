#include "benchmarks/ps_server_processes.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "benchmarks/process_cpu.h"

namespace pst {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(10);
constexpr absl::Duration kStopGrace = absl::Seconds(5);

std::string ExecutableDir() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "." : self.parent_path().string();
}

// The whole file, or "" if it cannot be read.
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A port on 127.0.0.1 that nothing listens on right now: the one the kernel
// picks for a socket bound to port 0.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return connected;
}

// User plus system time of process `pid` from /proc (0 once it is gone).

}  // namespace

absl::StatusOr<std::unique_ptr<PsServerProcesses>> PsServerProcesses::Start(
    int shards, int workers, int64_t max_message_bytes) {
  std::unique_ptr<PsServerProcesses> processes(new PsServerProcesses());
  char dir[] = "/tmp/ps_bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a temporary directory: ", strerror(errno)));
  }
  processes->dir_ = dir;
  std::string cluster = "cluster {";
  std::vector<int> ports;
  for (int s = 0; s < shards; ++s) {
    ports.push_back(FreePort());
    processes->addresses_.push_back(absl::StrCat("127.0.0.1:", ports.back()));
    absl::StrAppend(&cluster, " ps: \"", processes->addresses_.back(), "\"");
  }
  absl::StrAppend(&cluster, " workers: ", workers, " }\n");
  // The shards need a whole job's config; only the cluster, the mode and
  // the optimizer matter to them. The workers' Init gives them the model.
  const std::string config_path = processes->dir_ + "/cluster.textproto";
  std::ofstream(config_path) << cluster
                             << "training { mode: ASYNC optimizer { sgd { learning_rate: 1.0 } } "
                                "batch_size: 1 model { mlp { hidden: 1 } } "
                                "dataset { quadratic { examples: 1 } } }\n";
  for (int s = 0; s < shards; ++s) {
    if (absl::Status started = processes->StartShard(s, config_path, max_message_bytes);
        !started.ok()) {
      return started;
    }
  }
  const absl::Time deadline = absl::Now() + kStartTimeout;
  for (int s = 0; s < shards; ++s) {
    while (!Accepts(ports[s])) {
      int status = 0;
      const bool exited = waitpid(processes->pids_[s], &status, WNOHANG) == processes->pids_[s];
      if (exited || absl::Now() > deadline) {
        if (exited) processes->pids_[s] = -1;  // reaped: no longer ours to stop
        const std::string what =
            exited ? "exited" : absl::StrCat("did not listen on ", processes->addresses_[s],
                                             " within ", absl::FormatDuration(kStartTimeout));
        return absl::UnavailableError(absl::StrCat("ps_server for shard ", s, " ", what,
                                                   "; its output:\n",
                                                   ReadFile(processes->logs_[s])));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  return processes;
}

absl::Status PsServerProcesses::StartShard(int shard, const std::string& config_path,
                                           int64_t max_message_bytes) {
  const std::string binary = ExecutableDir() + "/ps_server";
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot run ", binary, " (", strerror(errno),
                                            "); build ps_server, or run with --shard_processes=false"));
  }
  logs_.push_back(absl::StrCat(dir_, "/ps_", shard, ".log"));
  std::vector<std::string> args = {binary, "--config=" + config_path,
                                    absl::StrCat("--task=ps:", shard), "--allow_insecure",
                                    absl::StrCat("--max_message_bytes=", max_message_bytes)};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log = open(logs_.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) return absl::InternalError(absl::StrCat("cannot write ", logs_.back()));
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  pids_.push_back(pid);
  return absl::OkStatus();
}

PsServerProcesses::~PsServerProcesses() {
  for (pid_t pid : pids_) {
    if (pid > 0) kill(pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + kStopGrace;
  for (pid_t pid : pids_) {
    if (pid <= 0) continue;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

double PsServerProcesses::CpuSeconds() const {
  double seconds = 0;
  for (pid_t pid : pids_) {
    if (pid > 0) seconds += ProcessCpuSeconds(pid);
  }
  return seconds;
}

}  // namespace pst
