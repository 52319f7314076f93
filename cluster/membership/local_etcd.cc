#include "cluster/membership/local_etcd.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/membership/etcd_client.h"
#include "common/server_ports.h"

namespace pst {

absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  // Held open together, so that they differ, then released.
  std::vector<int> fds, ports;
  const std::vector<int> candidates = ServerPortCandidates();
  int error = 0;
  for (auto port = candidates.begin(); port != candidates.end() && std::ssize(ports) < count;
       ++port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = errno;
      break;
    }
    fds.push_back(fd);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(*port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      ports.push_back(*port);
    } else if (errno != EADDRINUSE) {
      error = errno;
      break;
    }
  }
  for (int fd : fds) close(fd);
  if (std::ssize(ports) < count) {
    return absl::InternalError(absl::StrCat("no ", count,
                                            " free loopback ports outside the ephemeral range: ",
                                            error != 0 ? std::strerror(error) : "all are taken"));
  }
  return ports;
}

namespace {

constexpr char kOwnedPrefix[] = "pstrain-etcd.";
constexpr char kLockFile[] = "owner.lock";

// Removes the directories of owners that died: a lock nobody holds. A
// directory is named kOwnedPrefix only once its owner holds the lock.
void RemoveOrphanedDataDirs(const std::string& root) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (!entry.path().filename().string().starts_with(kOwnedPrefix)) continue;
    const std::string lock = (entry.path() / kLockFile).string();
    const int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(entry.path(), error);
    close(fd);
  }
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

// Whether `pid` has exited (reaping it).
bool Exited(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == pid;
}

}  // namespace

EtcdDataDir EtcdDataDir::Make(const std::string& fallback, const std::string& memory_root) {
  if (access(memory_root.c_str(), W_OK | X_OK) != 0) return EtcdDataDir(fallback, -1);
  RemoveOrphanedDataDirs(memory_root);
  // Made under another name, locked, then renamed: a directory under
  // kOwnedPrefix always has a holder until its owner dies.
  std::string staging = absl::StrCat(memory_root, "/pstrain-etcd-new.XXXXXX");
  if (mkdtemp(staging.data()) == nullptr) return EtcdDataDir(fallback, -1);
  const std::string lock = absl::StrCat(staging, "/", kLockFile);
  const int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  std::error_code error;
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (fd >= 0) close(fd);
    std::filesystem::remove_all(staging, error);
    return EtcdDataDir(fallback, -1);
  }
  const std::string owned =
      absl::StrCat(memory_root, "/", kOwnedPrefix, staging.substr(staging.size() - 6));
  if (rename(staging.c_str(), owned.c_str()) != 0) {
    close(fd);
    std::filesystem::remove_all(staging, error);
    return EtcdDataDir(fallback, -1);
  }
  return EtcdDataDir(std::move(owned), fd);
}

EtcdDataDir::EtcdDataDir(EtcdDataDir&& other) noexcept
    : path_(std::move(other.path_)), lock_fd_(std::exchange(other.lock_fd_, -1)) {}

EtcdDataDir::~EtcdDataDir() {
  if (lock_fd_ < 0) return;
  std::error_code error;
  std::filesystem::remove_all(path_, error);
  close(lock_fd_);
}

absl::StatusOr<std::unique_ptr<LocalEtcd>> LocalEtcd::Start(const std::string& dir,
                                                            absl::Duration timeout) {
  if (access(kEtcdProgram, X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kEtcdProgram, " is not installed; a job with backups keeps its shards' ",
                     "membership in etcd: apt-get install etcd-server (scripts/install_deps.sh "
                     "does), or name an etcd in cluster.membership.etcd_endpoints"));
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", dir, " for etcd: ", error.message()));
  }
  absl::StatusOr<std::vector<int>> ports = FreeLoopbackPorts(2);
  if (!ports.ok()) return ports.status();
  const std::string endpoint = absl::StrCat("127.0.0.1:", (*ports)[0]);
  const std::string client_url = absl::StrCat("http://", endpoint);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", (*ports)[1]);
  const std::string log = absl::StrCat(dir, "/etcd.log");
  EtcdDataDir data = EtcdDataDir::Make(dir);
  std::vector<std::string> args = {kEtcdProgram, "--name=pstrain",
                                   absl::StrCat("--data-dir=", data.path(), "/data"),
                                   absl::StrCat("--listen-client-urls=", client_url),
                                   absl::StrCat("--advertise-client-urls=", client_url),
                                   absl::StrCat("--listen-peer-urls=", peer_url),
                                   absl::StrCat("--initial-advertise-peer-urls=", peer_url),
                                   absl::StrCat("--initial-cluster=pstrain=", peer_url),
                                   // etcd's minimum lease is 1.5 election timeouts, rounded up
                                   // to whole seconds: 1 s here, 2 s with its defaults.
                                   "--heartbeat-interval=50", "--election-timeout=500"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", log, ": ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot start etcd: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Dies with whoever started it, however that one ends.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect({endpoint});
  if (!client.ok()) {
    KillAndReap(pid);
    return client.status();
  }
  // Ready once a read succeeds: etcd answers reads only with a leader.
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    if (Exited(pid)) {
      return absl::UnavailableError(
          absl::StrCat("etcd exited as it started (a port taken?); see ", log));
    }
    last = (*client)->Get("/ready", absl::Now() + absl::Milliseconds(200)).status();
    if (last.ok()) {
      return std::unique_ptr<LocalEtcd>(new LocalEtcd(pid, endpoint, std::move(data)));
    }
  }
  KillAndReap(pid);
  return absl::UnavailableError(absl::StrCat("etcd did not answer within ",
                                             absl::FormatDuration(timeout), " (", last.ToString(),
                                             "); see ", log));
}

LocalEtcd::~LocalEtcd() { KillAndReap(pid_); }

}  // namespace pst
