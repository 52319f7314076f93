// One holder of a directory at a time (HoldDirectory), across processes
// and within one; the kernel lets go of a killed holder's directory.
#include "common/file_lock.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/fresh_dir.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  std::string dir = FreshScratchDir(name);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(FileLockTest, ASecondHolderIsRefusedUntilTheFirstLetsGo) {
  const std::string dir = FreshDir("directory_lock_second");
  std::optional<absl::StatusOr<FileLock>> first =
      FileLock::HoldDirectory(dir, "the disk tier's folder");
  ASSERT_TRUE(first->ok()) << first->status();

  absl::StatusOr<FileLock> second = FileLock::HoldDirectory(dir, "the disk tier's folder");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("the disk tier's folder " + dir), HasSubstr("another live process")));

  first.reset();
  EXPECT_TRUE(FileLock::HoldDirectory(dir, "the disk tier's folder").ok());
}

TEST(FileLockTest, AMovedLockStillHoldsTheDirectory) {
  const std::string dir = FreshDir("directory_lock_moved");
  absl::StatusOr<FileLock> acquired = FileLock::HoldDirectory(dir, "a folder");
  ASSERT_TRUE(acquired.ok()) << acquired.status();
  std::optional<FileLock> moved(std::move(*acquired));
  acquired = absl::UnknownError("the moved-from lock is gone");  // destroys it: must not unlock

  EXPECT_EQ(FileLock::HoldDirectory(dir, "a folder").status().code(),
            absl::StatusCode::kFailedPrecondition);
  moved.reset();
  EXPECT_TRUE(FileLock::HoldDirectory(dir, "a folder").ok());
}

TEST(FileLockTest, AnotherProcessHoldsItUntilItIsKilled) {
  const std::string dir = FreshDir("directory_lock_process");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only system calls here: the child of a test process.
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    const char held = (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) ? 'y' : 'n';
    (void)!write(ready[1], &held, 1);
    for (;;) pause();
  }
  close(ready[1]);
  char held = 0;
  ASSERT_EQ(read(ready[0], &held, 1), 1);
  close(ready[0]);
  ASSERT_EQ(held, 'y');

  EXPECT_EQ(FileLock::HoldDirectory(dir, "a folder").status().code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(FileLock::HoldDirectory(dir, "a folder").ok());
}

// As on a filesystem without locks: flock(2) fails with EOPNOTSUPP (a
// seccomp filter in a child process, so that the test's own process keeps
// its locks). The folder is then used, unguarded, rather than refused.
TEST(FileLockTest, AFilesystemThatCannotLockLeavesTheFolderUsable) {
  const std::string dir = FreshDir("directory_lock_unsupported");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_flock, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EOPNOTSUPP & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog program = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      _exit(3);
    }
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 || errno != EOPNOTSUPP) _exit(4);  // the filter holds
    const bool first = FileLock::HoldDirectory(dir, "a folder").ok();
    const bool second = FileLock::HoldDirectory(dir, "a folder").ok();
    _exit(first && second ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: no seccomp filter; 4: flock not refused; 5: refused";
}

TEST(FileLockTest, AMissingDirectoryIsNamed) {
  const std::string dir = FreshDir("directory_lock_missing") + "/absent";
  absl::StatusOr<FileLock> lock = FileLock::HoldDirectory(dir, "a folder");
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(lock.status().message(), HasSubstr(dir));
}

}  // namespace PST_FILE_ID
}  // namespace pst
