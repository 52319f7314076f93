#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstring>
#include <vector>
#include <filesystem>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// These are the named regions' tests (shared_memory_sealed_test.cc has the
// sealed ones').
constexpr SharedRegion::Kind kNamed = SharedRegion::Kind::kNamed;

bool NameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(SharedMemoryTest, BootIdIsReadable) {
  absl::StatusOr<std::string> id = HostBootId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 36u);  // a UUID
}

TEST(SharedMemoryTest, OnlyRegionNamesAreAccepted) {
  EXPECT_TRUE(IsSharedRegionName("/pstrain-123-0-abcdef0123456789"));
  EXPECT_FALSE(IsSharedRegionName("/pstrain-"));
  EXPECT_FALSE(IsSharedRegionName("/other-123"));
  EXPECT_FALSE(IsSharedRegionName("/pstrain-../../etc/passwd"));
  EXPECT_FALSE(IsSharedRegionName("/pstrain-a/b"));
  EXPECT_FALSE(IsSharedRegionName(std::string("/pstrain-a\\0b", 12)));
  EXPECT_FALSE(IsSharedRegionName("/pstrain-" + std::string(65, 'a')));
  EXPECT_FALSE(IsSharedRegionName("pstrain-123"));
}

TEST(SharedMemoryTest, RegionNamesCarryTheCreatorsPid) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(100, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_THAT((*region)->name(), ::testing::StartsWith(SharedRegionPrefix(getpid())));
  EXPECT_TRUE(IsSharedRegionName((*region)->name()));
  EXPECT_EQ((*region)->bytes().size() % static_cast<size_t>(sysconf(_SC_PAGESIZE)), 0u);
}

TEST(SharedMemoryTest, OpeningUnlinksTheNameAndBothEndsSeeTheSameBytes) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(8192, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string name = (*region)->name();
  ASSERT_TRUE(NameExists(name));
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
      OpenedRegion::Open(name, static_cast<int64_t>((*region)->bytes().size()), (*region)->proof());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(NameExists(name));  // nothing is left behind, whoever dies next

  std::memcpy((*region)->bytes().data() + 100, "gradient", 8);
  char read[8];
  ASSERT_TRUE((*opened)->Read(100, read).ok());
  EXPECT_EQ(std::string(read, 8), "gradient");
  ASSERT_TRUE((*opened)->Write(4000, std::span<const char>("answer", 6)).ok());
  EXPECT_EQ(std::string((*region)->bytes().data() + 4000, 6), "answer");
  (*region)->MarkOffered();  // after the shard unlinked the name: harmless
}

TEST(SharedMemoryTest, ARenewedRegionKeepsItsAddressAndBytesUnderANewName) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(8192, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::span<char> bytes = (*region)->bytes();
  std::memcpy(bytes.data() + 5000, "values", 6);
  const std::string old_name = (*region)->name();
  const std::string old_proof = (*region)->proof();
  absl::StatusOr<std::unique_ptr<OpenedRegion>> old_shard =
      OpenedRegion::Open(old_name, static_cast<int64_t>(bytes.size()), old_proof);
  ASSERT_TRUE(old_shard.ok()) << old_shard.status();

  ASSERT_TRUE((*region)->Renew().ok());
  EXPECT_EQ((*region)->bytes().data(), bytes.data());
  EXPECT_EQ((*region)->bytes().size(), bytes.size());
  EXPECT_NE((*region)->name(), old_name);
  EXPECT_EQ(std::string(bytes.data() + 5000, 6), "values");
  absl::StatusOr<std::unique_ptr<OpenedRegion>> new_shard =
      OpenedRegion::Open((*region)->name(), static_cast<int64_t>(bytes.size()), (*region)->proof());
  ASSERT_TRUE(new_shard.ok()) << new_shard.status();
  char read[6];
  ASSERT_TRUE((*new_shard)->Read(5000, read).ok());
  EXPECT_EQ(std::string(read, 6), "values");
  // The old spans write into the new object; the old one is the old
  // shard's alone.
  std::memcpy(bytes.data() + 100, "after", 5);
  char seen[5];
  ASSERT_TRUE((*new_shard)->Read(100, seen).ok());
  EXPECT_EQ(std::string(seen, 5), "after");
  ASSERT_TRUE((*old_shard)->Read(100, seen).ok());
  EXPECT_NE(std::string(seen, 5), "after");
}

TEST(SharedMemoryTest, ADetachedRegionKeepsItsAddressAndBytesAndNoNameUntilRenewed) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(8192, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::span<char> bytes = (*region)->bytes();
  std::memcpy(bytes.data() + 5000, "values", 6);
  const std::string old_name = (*region)->name();
  const std::string old_proof = (*region)->proof();
  absl::StatusOr<std::unique_ptr<OpenedRegion>> shard =
      OpenedRegion::Open(old_name, static_cast<int64_t>(bytes.size()), old_proof);
  ASSERT_TRUE(shard.ok()) << shard.status();

  ASSERT_TRUE((*region)->Detach().ok());
  EXPECT_FALSE((*region)->fresh());
  EXPECT_EQ((*region)->bytes().data(), bytes.data());
  EXPECT_EQ(std::string(bytes.data() + 5000, 6), "values");
  const std::string prefix = SharedRegionPrefix(getpid()).substr(1);  // without the '/'
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_FALSE(absl::StartsWith(entry.path().filename().string(), prefix)) << entry.path();
  }
  // What this process writes now, the shard that held the object never sees.
  std::memcpy(bytes.data() + 100, "after", 5);
  char seen[5];
  ASSERT_TRUE((*shard)->Read(100, seen).ok());
  EXPECT_NE(std::string(seen, 5), "after");

  ASSERT_TRUE((*region)->Renew().ok());
  EXPECT_TRUE((*region)->fresh());
  EXPECT_EQ((*region)->bytes().data(), bytes.data());
  absl::StatusOr<std::unique_ptr<OpenedRegion>> again =
      OpenedRegion::Open((*region)->name(), static_cast<int64_t>(bytes.size()), (*region)->proof());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Read(100, seen).ok());
  EXPECT_EQ(std::string(seen, 5), "after");
}

TEST(SharedMemoryTest, DestroyingAnUnopenedRegionRemovesItsName) {
  std::string name;
  {
    absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(4096, kNamed);
    ASSERT_TRUE(region.ok()) << region.status();
    name = (*region)->name();
    ASSERT_TRUE(NameExists(name));
  }
  EXPECT_FALSE(NameExists(name));
}

TEST(SharedMemoryTest, OpenRefusesWrongNamesAndSizes) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(4096, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  const int64_t size = static_cast<int64_t>((*region)->bytes().size());
  EXPECT_EQ(OpenedRegion::Open("/dev/shm/x", size, (*region)->proof()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenedRegion::Open("/pstrain-no-such-region", size, (*region)->proof()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<OpenedRegion>> wrong =
      OpenedRegion::Open((*region)->name(), size * 2, (*region)->proof());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("not a region of the"));
}

// A hostile local user offers a large object it never wrote: attaching it
// commits none of its memory (the shard's memory cgroup is charged for what
// it touches), and a copy commits only the pages it reaches.
TEST(SharedMemoryTest, OpeningCommitsNoMemoryOnlyCopiesDo) {
  constexpr int64_t kBytes = 64 << 20;
  const std::string name = SharedRegionPrefix(getpid()) + "sparse";
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const int64_t page = sysconf(_SC_PAGESIZE);
  ASSERT_EQ(ftruncate(fd, kBytes + page), 0);
  const std::string proof(kRegionProofBytes, 'p');
  ASSERT_EQ(pwrite(fd, proof.data(), proof.size(), kBytes), static_cast<ssize_t>(proof.size()));
  const auto committed = [fd] {
    struct stat status;
    EXPECT_EQ(fstat(fd, &status), 0);
    return static_cast<int64_t>(status.st_blocks) * 512;
  };
  const int64_t proof_page = committed();
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened = OpenedRegion::Open(name, kBytes, proof);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(committed(), proof_page);
  std::vector<char> answer(4096, 'a');
  ASSERT_TRUE((*opened)->Write(kBytes / 2, answer).ok());
  EXPECT_EQ(committed(), proof_page + 4096);
  close(fd);
}

// Every local user sees a region's name in /dev/shm: one who offers it
// first, without the proof its creator wrote, is refused, and the name
// stays for the creator's own offer.
TEST(SharedMemoryTest, OpeningNeedsTheCreatorsProofAndAWrongOneLeavesTheName) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(4096, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  const int64_t size = static_cast<int64_t>((*region)->bytes().size());
  EXPECT_EQ((*region)->proof().size(), kRegionProofBytes);
  for (const std::string& guess :
       {std::string(), std::string(kRegionProofBytes, '\0'), std::string("short")}) {
    absl::StatusOr<std::unique_ptr<OpenedRegion>> stolen =
        OpenedRegion::Open((*region)->name(), size, guess);
    EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(stolen.status().message(), HasSubstr("does not hold the proof"));
    EXPECT_TRUE(NameExists((*region)->name()));
  }
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
      OpenedRegion::Open((*region)->name(), size, (*region)->proof());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(NameExists((*region)->name()));
}

TEST(SharedMemoryTest, RangesOutsideTheRegionAreRefused) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(4096, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
      OpenedRegion::Open((*region)->name(), static_cast<int64_t>((*region)->bytes().size()), (*region)->proof());
  ASSERT_TRUE(opened.ok()) << opened.status();
  const int64_t size = (*opened)->size();
  char buffer[16];
  EXPECT_TRUE((*opened)->Read(size - 16, buffer).ok());
  EXPECT_EQ((*opened)->Read(size - 15, buffer).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opened)->Read(-1, buffer).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opened)->Write(size, std::span<const char>(buffer, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*opened)->CheckRange(1, INT64_MAX).code(), absl::StatusCode::kInvalidArgument);
}

// A region of four pages the shard has opened, and a hostile owner with a
// descriptor of its own to shrink it with.
class ShrunkRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(4 * page_, kNamed);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
    std::memset(region_->bytes().data(), 7, region_->bytes().size());
    owner_ = shm_open(region_->name().c_str(), O_RDWR, 0);
    ASSERT_GE(owner_, 0);
    absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
        OpenedRegion::Open(region_->name(), 4 * page_, region_->proof());
    ASSERT_TRUE(opened.ok()) << opened.status();
    opened_ = std::move(*opened);
  }
  void TearDown() override {
    if (owner_ >= 0) close(owner_);
  }

  // The owner cuts the region to its first page.
  void CutToOnePage() {
    ASSERT_EQ(ftruncate(owner_, page_), 0);
    close(owner_);
    owner_ = -1;
  }

  const int64_t page_ = sysconf(_SC_PAGESIZE);
  std::unique_ptr<SharedRegion> region_;
  int owner_ = -1;
  std::unique_ptr<OpenedRegion> opened_;
};

// The owner may shrink its region under the shard: the shard notices, and a
// read past the new end is refused, never a fault.
TEST_F(ShrunkRegionTest, AShrunkRegionIsRefusedNotAFault) {
  ASSERT_TRUE(opened_->CheckNotShrunk().ok());
  CutToOnePage();
  EXPECT_EQ(opened_->CheckNotShrunk().code(), absl::StatusCode::kInvalidArgument);
  std::vector<char> buffer(2 * page_);
  absl::Status read = opened_->Read(0, buffer);
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.message(), HasSubstr("shrank"));
}

// A copy that runs into the part the owner cut off faults; the fault is
// caught, and that copy and every later one are refused, the region's
// surviving pages included.
TEST_F(ShrunkRegionTest, ACopyIntoAShrunkRegionIsRefusedNotAFault) {
  CutToOnePage();
  const std::vector<char> answer(page_, 'a');
  absl::Status written = opened_->Write(2 * page_, answer);
  EXPECT_EQ(written.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(written.message(), HasSubstr("shrank"));
  std::vector<char> buffer(page_);
  EXPECT_EQ(opened_->Read(0, buffer).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(opened_->CheckNotShrunk().code(), absl::StatusCode::kInvalidArgument);
}

// What a visitor reads where the owner has cut the region off is zeros,
// never a fault, and the visit is refused.
TEST_F(ShrunkRegionTest, AVisitOfAShrunkRegionIsRefusedNotAFault) {
  int64_t sum = 0;
  auto add = [&](std::span<const char> bytes) {
    for (char c : bytes) sum += c;
  };
  ASSERT_TRUE(opened_->Visit(0, page_, add).ok());
  EXPECT_EQ(sum, 7 * page_);
  CutToOnePage();
  sum = 0;
  absl::Status visited = opened_->Visit(0, 4 * page_, add);
  EXPECT_EQ(visited.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(visited.message(), HasSubstr("shrank"));
  EXPECT_LE(sum, 7 * page_) << "the cut-off pages read as zeros";
}

// A SIGBUS another process sends (kill -BUS) is not a fault: it is
// ignored, and the guard still catches the next real cut-off.
TEST_F(ShrunkRegionTest, ASigbusSentFromOutsideLeavesTheGuardInPlace) {
  EXPECT_EXIT(
      {
        kill(getpid(), SIGBUS);  // delivered before kill returns: no other thread takes it
        CutToOnePage();
        const std::vector<char> answer(page_, 'a');
        const absl::Status written = opened_->Write(2 * page_, answer);
        _exit(written.code() == absl::StatusCode::kInvalidArgument ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "ignored a SIGBUS sent by another process");
}

// A fault outside every region still ends the process as SIGBUS does.
TEST_F(ShrunkRegionTest, AFaultOutsideTheRegionsStillEndsTheProcess) {
  EXPECT_EXIT(
      {
        char path[] = "/tmp/pstrain-sigbus-XXXXXX";
        const int fd = mkstemp(path);
        unlink(path);
        if (fd < 0 || ftruncate(fd, page_) != 0) _exit(2);
        auto* mapped = static_cast<volatile char*>(
            mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
        if (mapped == MAP_FAILED) _exit(2);
        mapped[page_] = 1;  // past the file's end
        _exit(3);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

// The shard copies into a mapping, not with write(2): a file-size limit
// (RLIMIT_FSIZE, e.g. a PS run under prlimit) does not stop its answers.
TEST(SharedMemoryTest, AFileSizeLimitDoesNotStopAnswers) {
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = SharedRegion::Create(1 << 20, kNamed);
  ASSERT_TRUE(region.ok()) << region.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // as ps_server does
    const rlimit limit{65536, 65536};
    setrlimit(RLIMIT_FSIZE, &limit);
    absl::StatusOr<std::unique_ptr<OpenedRegion>> opened =
        OpenedRegion::Open((*region)->name(), 1 << 20, (*region)->proof());
    if (!opened.ok()) _exit(1);
    const std::vector<char> answer(1 << 20, 'a');
    _exit((*opened)->Write(0, answer).ok() ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ((*region)->bytes()[(1 << 20) - 1], 'a');
}

}  // namespace PST_FILE_ID
}  // namespace pst
