// One holder of a directory at a time, across processes and within one;
// the kernel lets go of a killed holder's directory.
#include "common/directory_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

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

TEST(DirectoryLockTest, ASecondHolderIsRefusedUntilTheFirstLetsGo) {
  const std::string dir = FreshDir("directory_lock_second");
  std::optional<absl::StatusOr<DirectoryLock>> first =
      DirectoryLock::Acquire(dir, "the disk tier's folder");
  ASSERT_TRUE(first->ok()) << first->status();

  absl::StatusOr<DirectoryLock> second = DirectoryLock::Acquire(dir, "the disk tier's folder");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("the disk tier's folder " + dir), HasSubstr("another live process")));

  first.reset();
  EXPECT_TRUE(DirectoryLock::Acquire(dir, "the disk tier's folder").ok());
}

TEST(DirectoryLockTest, AMovedLockStillHoldsTheDirectory) {
  const std::string dir = FreshDir("directory_lock_moved");
  absl::StatusOr<DirectoryLock> acquired = DirectoryLock::Acquire(dir, "a folder");
  ASSERT_TRUE(acquired.ok()) << acquired.status();
  std::optional<DirectoryLock> moved(std::move(*acquired));
  acquired = absl::UnknownError("the moved-from lock is gone");  // destroys it: must not unlock

  EXPECT_EQ(DirectoryLock::Acquire(dir, "a folder").status().code(),
            absl::StatusCode::kFailedPrecondition);
  moved.reset();
  EXPECT_TRUE(DirectoryLock::Acquire(dir, "a folder").ok());
}

TEST(DirectoryLockTest, AnotherProcessHoldsItUntilItIsKilled) {
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

  EXPECT_EQ(DirectoryLock::Acquire(dir, "a folder").status().code(),
            absl::StatusCode::kFailedPrecondition);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(DirectoryLock::Acquire(dir, "a folder").ok());
}

TEST(DirectoryLockTest, AMissingDirectoryIsNamed) {
  const std::string dir = FreshDir("directory_lock_missing") + "/absent";
  absl::StatusOr<DirectoryLock> lock = DirectoryLock::Acquire(dir, "a folder");
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(lock.status().message(), HasSubstr(dir));
}

}  // namespace PST_FILE_ID
}  // namespace pst
