// Sealed regions (memfds whose size is sealed): what a hostile owner can no
// longer do to a shard that maps one, and which descriptors a shard
// refuses. Named regions are tests/common/shared_memory_test.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

const int64_t kPage = sysconf(_SC_PAGESIZE);

std::unique_ptr<SharedRegion> SealedRegion(int64_t bytes) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(bytes);
  EXPECT_TRUE(region.ok()) << region.status();
  EXPECT_EQ((*region)->kind(), SharedRegion::Kind::kSealed) << "this kernel cannot seal a memfd";
  return std::move(*region);
}

// A memfd of `bytes` bytes with `seals` added.
int Memfd(int64_t bytes, int seals) {
  const int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0) << std::strerror(errno);
  EXPECT_EQ(ftruncate(fd, bytes), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0) << std::strerror(errno);
  }
  return fd;
}

TEST(SealedRegionTest, ASealedRegionHasNoNameAndItsSizeCannotChange) {
  std::unique_ptr<SharedRegion> region = SealedRegion(8192);
  ASSERT_EQ(region->kind(), SharedRegion::Kind::kSealed);
  EXPECT_TRUE(region->name().empty());
  EXPECT_TRUE(region->proof().empty());
  const int fd = region->fd();
  EXPECT_EQ(ftruncate(fd, 4096), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(fd, 3 * 8192), -1);
  EXPECT_EQ(errno, EPERM);
  // Nor can the seals be taken off or changed.
  EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  EXPECT_EQ(errno, EPERM);
  struct stat status;
  ASSERT_EQ(fstat(fd, &status), 0);
  EXPECT_EQ(status.st_size, 8192);
}

// The worker that owns the region tries to cut it short under the shard:
// the kernel refuses, and the shard's copies over the whole region go on
// (on a named region the same shrink makes them fault: ShrunkRegionTest).
TEST(SealedRegionTest, AnAdoptedRegionCannotBeShrunkUnderTheShard) {
  std::unique_ptr<SharedRegion> region = SealedRegion(4 * kPage);
  std::memset(region->bytes().data(), 7, region->bytes().size());
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
      OpenedRegion::Adopt(dup(region->fd()), 4 * kPage);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE((*opened)->sealed());

  EXPECT_EQ(ftruncate(region->fd(), kPage), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_TRUE((*opened)->CheckNotShrunk().ok());
  std::vector<char> buffer(4 * kPage);
  ASSERT_TRUE((*opened)->Read(0, buffer).ok());
  EXPECT_EQ(buffer.back(), 7);
  const std::vector<char> answer(kPage, 'a');
  ASSERT_TRUE((*opened)->Write(3 * kPage, answer).ok());
  EXPECT_EQ(region->bytes()[4 * kPage - 1], 'a');
}

TEST(SealedRegionTest, AdoptRefusesWhatIsNotASealedRegionOfTheAnnouncedSize) {
  struct Case {
    const char* what;
    int seals;
    int64_t announced;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"unsealed", 0, kPage, absl::StatusCode::kPermissionDenied},
      {"may grow", F_SEAL_SHRINK, kPage, absl::StatusCode::kPermissionDenied},
      {"may shrink", F_SEAL_GROW, kPage, absl::StatusCode::kPermissionDenied},
      {"write-sealed", F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE, kPage,
       absl::StatusCode::kPermissionDenied},
      {"future-write-sealed", F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE, kPage,
       absl::StatusCode::kPermissionDenied},
      {"another size", F_SEAL_SHRINK | F_SEAL_GROW, 2 * kPage,
       absl::StatusCode::kInvalidArgument},
      {"no size", F_SEAL_SHRINK | F_SEAL_GROW, 0, absl::StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int fd = Memfd(kPage, c.seals);
    absl::StatusOr<std::unique_ptr<OpenedRegion>> opened = OpenedRegion::Adopt(fd, c.announced);
    EXPECT_EQ(opened.status().code(), c.code) << opened.status();
    EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "Adopt closes what it refuses";
  }
  // A file on disk has no seals at all.
  char path[] = "/tmp/pstrain-sealed-XXXXXX";
  const int file = mkstemp(path);
  ASSERT_GE(file, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(file, kPage), 0);
  EXPECT_EQ(OpenedRegion::Adopt(file, kPage).status().code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<std::unique_ptr<OpenedRegion>> sealed =
      OpenedRegion::Adopt(Memfd(kPage, F_SEAL_SHRINK | F_SEAL_GROW), kPage);
  EXPECT_TRUE(sealed.ok()) << sealed.status();
}

TEST(SealedRegionTest, ARenewedRegionKeepsItsAddressAndBytesInANewSealedObject) {
  std::unique_ptr<SharedRegion> region = SealedRegion(8192);
  const std::span<char> bytes = region->bytes();
  std::memcpy(bytes.data() + 5000, "values", 6);
  absl::StatusOr<std::unique_ptr<OpenedRegion>> old_shard =
      OpenedRegion::Adopt(dup(region->fd()), 8192);
  ASSERT_TRUE(old_shard.ok()) << old_shard.status();
  region->MarkOffered();
  EXPECT_FALSE(region->fresh());

  ASSERT_TRUE(region->Renew().ok());
  EXPECT_TRUE(region->fresh());
  EXPECT_EQ(region->kind(), SharedRegion::Kind::kSealed);
  EXPECT_EQ(region->bytes().data(), bytes.data());
  EXPECT_EQ(std::string(bytes.data() + 5000, 6), "values");
  EXPECT_EQ(ftruncate(region->fd(), 4096), -1) << "the new object is sealed too";
  absl::StatusOr<std::unique_ptr<OpenedRegion>> new_shard =
      OpenedRegion::Adopt(dup(region->fd()), 8192);
  ASSERT_TRUE(new_shard.ok()) << new_shard.status();
  std::memcpy(bytes.data() + 100, "after", 5);
  char seen[5];
  ASSERT_TRUE((*new_shard)->Read(100, seen).ok());
  EXPECT_EQ(std::string(seen, 5), "after");
  ASSERT_TRUE((*old_shard)->Read(100, seen).ok());
  EXPECT_NE(std::string(seen, 5), "after");
}

// Where the shard cannot take a descriptor, the worker moves its region to
// a named object, at the same address.
TEST(SealedRegionTest, ASealedRegionRenewsAsANamedOne) {
  std::unique_ptr<SharedRegion> region = SealedRegion(8192);
  const std::span<char> bytes = region->bytes();
  std::memcpy(bytes.data(), "kept", 4);
  region->MarkOffered();
  ASSERT_TRUE(region->Renew(SharedRegion::Kind::kNamed).ok());
  EXPECT_EQ(region->kind(), SharedRegion::Kind::kNamed);
  EXPECT_FALSE(region->name().empty());
  EXPECT_EQ(region->bytes().data(), bytes.data());
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
      OpenedRegion::Open(region->name(), 8192, region->proof());
  ASSERT_TRUE(opened.ok()) << opened.status();
  char seen[4];
  ASSERT_TRUE((*opened)->Read(0, seen).ok());
  EXPECT_EQ(std::string(seen, 4), "kept");
}

TEST(SealedRegionTest, ADetachedRegionKeepsItsBytesAwayFromTheShard) {
  std::unique_ptr<SharedRegion> region = SealedRegion(8192);
  absl::StatusOr<std::unique_ptr<OpenedRegion>> shard =
      OpenedRegion::Adopt(dup(region->fd()), 8192);
  ASSERT_TRUE(shard.ok()) << shard.status();
  std::memcpy(region->bytes().data(), "before", 6);
  ASSERT_TRUE(region->Detach().ok());
  EXPECT_EQ(region->fd(), -1);
  EXPECT_FALSE(region->fresh());
  EXPECT_EQ(std::string(region->bytes().data(), 6), "before");
  std::memcpy(region->bytes().data(), "after!", 6);
  char seen[6];
  ASSERT_TRUE((*shard)->Read(0, seen).ok());
  EXPECT_EQ(std::string(seen, 6), "before");
}

}  // namespace PST_FILE_ID
}  // namespace pst
