// EtcdDataDir: an etcd's data in memory, removed with its owner, and the
// directory of an owner that died removed by the next one made.
#include "cluster/membership/local_etcd.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

bool HasMemoryRoot() { return access("/dev/shm", W_OK | X_OK) == 0; }

TEST(EtcdDataDirTest, LivesInMemoryAndGoesWithItsOwner) {
  if (!HasMemoryRoot()) {
    // No tmpfs here: the caller's directory, left in place.
    const std::string fallback = ScratchDir() + "/etcd";
    std::filesystem::create_directories(fallback);
    { EXPECT_EQ(EtcdDataDir::Make(fallback).path(), fallback); }
    EXPECT_TRUE(std::filesystem::is_directory(fallback));
    return;
  }
  std::string path;
  {
    EtcdDataDir dir = EtcdDataDir::Make(ScratchDir());
    EXPECT_TRUE(dir.in_memory());
    path = dir.path();
    EXPECT_TRUE(path.starts_with("/dev/shm/pstrain-etcd.")) << path;
    EXPECT_TRUE(std::filesystem::is_directory(path));
    EtcdDataDir moved = std::move(dir);
    EXPECT_EQ(moved.path(), path);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(EtcdDataDirTest, TheDirectoryOfAnOwnerThatDiedGoesAndALiveOnesStays) {
  // A root of the test's own, so that the test runs where /dev/shm does not.
  const std::string root = ScratchDir() + "/memory";
  std::filesystem::create_directories(root);
  EtcdDataDir live = EtcdDataDir::Make(ScratchDir(), root);
  ASSERT_TRUE(live.in_memory());
  // What an owner killed outright leaves: the directory, its lock released.
  const std::string orphan = root + "/pstrain-etcd.orphan-" + std::to_string(getpid());
  std::filesystem::create_directories(orphan + "/data");
  const int fd = open((orphan + "/owner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  {
    EtcdDataDir while_held = EtcdDataDir::Make(ScratchDir(), root);
    EXPECT_TRUE(std::filesystem::exists(orphan)) << "removed while its owner held the lock";
  }
  close(fd);  // the owner dies
  EtcdDataDir next = EtcdDataDir::Make(ScratchDir(), root);
  EXPECT_FALSE(std::filesystem::exists(orphan));
  EXPECT_TRUE(std::filesystem::is_directory(live.path()));
}

}  // namespace PST_FILE_ID
}  // namespace pst
