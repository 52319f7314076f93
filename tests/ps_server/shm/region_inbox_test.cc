// The shard's region inbox, played by hostile local processes: another
// user, silent connections, malformed messages. None of them gets a region
// in, grows the inbox's threads, or keeps a worker's handoff out.
#include "ps_server/shm/region_inbox.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/region_handoff.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/thread_count.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr uint64_t kHandle = 42;

int OpenDescriptors() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++count;
  }
  return count;
}

class RegionInboxTest : public ::testing::Test {
 protected:
  void Start(RegionInbox::Limits limits = {}) {
    absl::StatusOr<std::unique_ptr<RegionInbox>> inbox = RegionInbox::Start(
        [this](absl::string_view nonce, int fd) -> absl::StatusOr<uint64_t> {
          close(fd);
          absl::MutexLock lock(&mu_);
          ++adopted_;
          if (nonce != nonce_) return absl::PermissionDeniedError("unknown nonce");
          return kHandle;
        },
        limits);
    ASSERT_TRUE(inbox.ok()) << inbox.status();
    inbox_ = std::move(*inbox);
  }
  void SetUp() override { Start(); }

  // A connection to the inbox, as any local process can open.
  int Connect() const {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_un address;
    const socklen_t length = AbstractSocketAddress(inbox_->name(), &address);
    EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&address), length), 0)
        << std::strerror(errno);
    return fd;
  }

  // The inbox's answer on `fd` (blocks until it comes, and until the
  // inbox has closed its end), then closes it.
  static absl::StatusOr<uint64_t> Answer(int fd) {
    char reply[512];
    const ssize_t received = recv(fd, reply, sizeof(reply), 0);
    char more;
    EXPECT_LE(recv(fd, &more, 1, 0), 0) << "the inbox answers once";
    close(fd);
    if (received <= 0) return absl::UnavailableError("no answer");
    return DecodeHandoffReply(absl::string_view(reply, static_cast<size_t>(received)));
  }

  // Sends `data` with `fds` attached on `fd`.
  static void Send(int fd, absl::string_view data, const std::vector<int>& fds) {
    iovec buffer{const_cast<char*>(data.data()), data.size()};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    msghdr message = {};
    message.msg_iov = &buffer;
    message.msg_iovlen = 1;
    if (!fds.empty()) {
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      cmsghdr* rights = CMSG_FIRSTHDR(&message);
      rights->cmsg_level = SOL_SOCKET;
      rights->cmsg_type = SCM_RIGHTS;
      rights->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(rights), fds.data(), sizeof(int) * fds.size());
    }
    ASSERT_EQ(sendmsg(fd, &message, MSG_NOSIGNAL), static_cast<ssize_t>(data.size()))
        << std::strerror(errno);
  }

  static int NewMemfd() { return memfd_create("inbox-test", MFD_CLOEXEC); }

  int adopted() {
    absl::MutexLock lock(&mu_);
    return adopted_;
  }

  const std::string nonce_ = RandomBytes(kHandoffNonceBytes);
  absl::Mutex mu_;
  int adopted_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<RegionInbox> inbox_;
};

TEST_F(RegionInboxTest, ADescriptorWithItsNonceIsAdoptedAndItsHandleAnswered) {
  const int memfd = NewMemfd();
  absl::StatusOr<uint64_t> handle =
      HandOverRegion(inbox_->name(), nonce_, memfd, absl::Seconds(10));
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(*handle, kHandle);
  EXPECT_EQ(adopted(), 1);
  close(memfd);
}

TEST_F(RegionInboxTest, TheShardsRefusalReachesTheWorker) {
  const int memfd = NewMemfd();
  absl::StatusOr<uint64_t> handle =
      HandOverRegion(inbox_->name(), RandomBytes(kHandoffNonceBytes), memfd, absl::Seconds(10));
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(handle.status().message(), HasSubstr("unknown nonce"));
  close(memfd);
}

TEST_F(RegionInboxTest, AnUnreachableSocketIsUnavailable) {
  const int memfd = NewMemfd();
  absl::StatusOr<uint64_t> handle =
      HandOverRegion("pstrain-ps-nobody-listens", nonce_, memfd, absl::Seconds(10));
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kUnavailable);
  close(memfd);
}

// A message that is not one nonce with one descriptor is refused before
// the shard sees it, and every descriptor it carried is closed.
TEST_F(RegionInboxTest, MalformedHandoffsAreRefusedAndTheirDescriptorsClosed) {
  const int before = OpenDescriptors();
  struct Case {
    const char* what;
    std::string data;
    int descriptors;
  };
  const Case cases[] = {
      {"no descriptor", nonce_, 0},
      {"two descriptors", nonce_, 2},
      {"a short nonce", nonce_.substr(0, 8), 1},
      {"a long nonce", nonce_ + "x", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<int> fds;
    for (int i = 0; i < c.descriptors; ++i) fds.push_back(NewMemfd());
    const int connection = Connect();
    ASSERT_NO_FATAL_FAILURE(Send(connection, c.data, fds));
    for (int fd : fds) close(fd);
    EXPECT_EQ(Answer(connection).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // An empty message is how a closed connection reads: refused all the same.
  const int closed = Connect();
  shutdown(closed, SHUT_WR);
  EXPECT_EQ(Answer(closed).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(adopted(), 0);
  EXPECT_EQ(OpenDescriptors(), before) << "the inbox kept descriptors it refused";
  EXPECT_EQ(inbox_->refused(), 5);
}

TEST_F(RegionInboxTest, AProcessOfAnotherUserIsRefusedAsItConnects) {
  if (geteuid() != 0) GTEST_SKIP() << "only root can connect as another user here";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    const int memfd = memfd_create("other-user", MFD_CLOEXEC);
    absl::StatusOr<uint64_t> handle =
        HandOverRegion(inbox_->name(), nonce_, memfd, absl::Seconds(10));
    // The inbox's socket is root's: the worker side refuses it first, so
    // the inbox is asked directly too.
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un address;
    const socklen_t length = AbstractSocketAddress(inbox_->name(), &address);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) _exit(4);
    char reply[512];
    const ssize_t received = recv(fd, reply, sizeof(reply), 0);
    if (received <= 0) _exit(5);
    absl::StatusOr<uint64_t> answer =
        DecodeHandoffReply(absl::string_view(reply, static_cast<size_t>(received)));
    _exit(handle.status().code() == absl::StatusCode::kPermissionDenied &&
                  answer.status().code() == absl::StatusCode::kPermissionDenied
              ? 0
              : 6);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(adopted(), 0);
  EXPECT_EQ(inbox_->refused(), 2);  // as it connected, both times
}

// Connections that never send: at most max_pending wait, the rest are
// refused as they come, none adds a thread, and a worker's handoff gets
// through once they are gone.
TEST_F(RegionInboxTest, SilentConnectionsAreCappedAndHoldNoThread) {
  inbox_.reset();
  Start({.max_pending = 4, .deadline = absl::Seconds(60)});
  const int threads = ThreadCount();
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(Connect());
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<uint64_t> refused = Answer(Connect());
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  }
  EXPECT_EQ(ThreadCount(), threads);
  for (int fd : silent) close(fd);
  const int memfd = NewMemfd();
  // The four are closed: at its cap, the inbox drops what has hung up
  // before it refuses a newcomer.
  absl::StatusOr<uint64_t> handle =
      HandOverRegion(inbox_->name(), nonce_, memfd, absl::Seconds(10));
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(*handle, kHandle);
  close(memfd);
}

TEST_F(RegionInboxTest, AConnectionThatSendsNothingIsDroppedAtItsDeadline) {
  inbox_.reset();
  Start({.max_pending = 4, .deadline = absl::Milliseconds(200)});
  const absl::Time start = absl::Now();
  EXPECT_EQ(Answer(Connect()).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_EQ(inbox_->refused(), 1);
}

}  // namespace PST_FILE_ID
}  // namespace pst
