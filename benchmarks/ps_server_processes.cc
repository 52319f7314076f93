#include "benchmarks/ps_server_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
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

// The port in a file ps_server --port_file wrote (renamed into place
// whole), or 0 while there is none.
int ReadPort(const std::string& path) {
  std::string text = ReadFile(path);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  int port = 0;
  return absl::SimpleAtoi(text, &port) && port > 0 && port < 65536 ? port : 0;
}

// Where shard `shard` writes the port it got.
std::string PortFile(const std::string& dir, int shard) {
  return absl::StrCat(dir, "/ps_", shard, ".port");
}

}  // namespace

absl::StatusOr<std::unique_ptr<PsServerProcesses>> PsServerProcesses::Start(
    int shards, int workers, int64_t max_message_bytes) {
  return Start({.shards = shards, .workers = workers, .max_message_bytes = max_message_bytes});
}

absl::StatusOr<std::unique_ptr<PsServerProcesses>> PsServerProcesses::Start(
    const PsServerOptions& options) {
  const int shards = options.shards;
  std::unique_ptr<PsServerProcesses> processes(new PsServerProcesses());
  char dir[] = "/tmp/ps_bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a temporary directory: ", strerror(errno)));
  }
  processes->dir_ = dir;
  // Every shard binds port 0 and reports the port it got (--port_file).
  std::string cluster = "cluster {";
  for (int s = 0; s < shards; ++s) absl::StrAppend(&cluster, " ps: \"127.0.0.1:0\"");
  absl::StrAppend(&cluster, " workers: ", options.workers, " worker_command: \"ps_bench\" }\n");
  // The shards need a whole job's config; only the cluster, the mode and
  // the optimizer matter to them. The workers' Init gives them the model:
  // a worker_command says the workers bring their own, so a shard does not
  // expect the config's.
  const std::string config_path = processes->dir_ + "/cluster.textproto";
  std::ofstream config(config_path);
  config << cluster << "training { mode: ASYNC optimizer { " << options.optimizer
         << " } batch_size: 1 model { mlp { hidden: 1 } } dataset { quadratic { examples: 1 } }";
  if (options.checkpoints) {
    config << " checkpoint { dir: \"" << processes->dir_
           << "/checkpoints\" full_every: " << options.full_every << " }";
  }
  config << " }\n";
  config.close();
  for (int s = 0; s < shards; ++s) {
    if (absl::Status started = processes->StartShard(s, config_path, options.max_message_bytes);
        !started.ok()) {
      return started;
    }
  }
  const absl::Time deadline = absl::Now() + kStartTimeout;
  for (int s = 0; s < shards; ++s) {
    int port = 0;
    while ((port = ReadPort(PortFile(processes->dir_, s))) == 0) {
      int status = 0;
      const bool exited = waitpid(processes->pids_[s], &status, WNOHANG) == processes->pids_[s];
      if (exited || absl::Now() > deadline) {
        if (exited) processes->pids_[s] = -1;  // reaped: no longer ours to stop
        const std::string what =
            exited ? "exited" : absl::StrCat("did not report the port it got within ",
                                             absl::FormatDuration(kStartTimeout));
        return absl::UnavailableError(absl::StrCat("ps_server for shard ", s, " ", what,
                                                   "; its output:\n",
                                                   ReadFile(processes->logs_[s])));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    processes->addresses_.push_back(absl::StrCat("127.0.0.1:", port));
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
                                    absl::StrCat("--max_message_bytes=", max_message_bytes),
                                    "--port_file=" + PortFile(dir_, shard)};
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

int64_t PsServerProcesses::ResidentBytes() const {
  int64_t bytes = 0;
  for (pid_t pid : pids_) {
    if (pid > 0) bytes += ProcessResidentBytes(pid);
  }
  return bytes;
}

}  // namespace pst
