// A ps_server process in a memory cgroup, as a container runs it: regions
// that local processes attach cost it no memory until exchanges touch them,
// so attaching large regions nobody wrote neither kills it nor stalls it.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "benchmarks/ps_server_processes.h"
#include "common/shared_memory.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "ps.grpc.pb.h"
#include "tests/support/memory_cgroup.h"

namespace pst {
namespace PST_FILE_ID {

constexpr int64_t kCgroupLimit = 96 << 20;
constexpr int64_t kRegionBytes = 256 << 20;

// A region-named object of kRegionBytes that nobody has written but its proof.
class SparseObject {
 public:
  explicit SparseObject(int index)
      : name_(absl::StrCat(SharedRegionPrefix(getpid()), "sparse-", index)) {
    fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd_, 0) << std::strerror(errno);
    // The region's bytes and its proof's page (common/shared_memory.h).
    EXPECT_EQ(ftruncate(fd_, kRegionBytes + sysconf(_SC_PAGESIZE)), 0);
    EXPECT_EQ(pwrite(fd_, proof_.data(), proof_.size(), kRegionBytes),
              static_cast<ssize_t>(proof_.size()));
  }
  ~SparseObject() {
    shm_unlink(name_.c_str());  // ENOENT once the shard has opened it
    close(fd_);
  }
  const std::string& name() const { return name_; }
  const std::string& proof() const { return proof_; }

 private:
  std::string name_;
  const std::string proof_ = std::string(kRegionProofBytes, 'p');
  int fd_ = -1;
};

TEST(RegionMemoryTest, AttachingRegionsNobodyWroteCostsAPsInAMemoryCgroupNothing) {
  absl::StatusOr<std::unique_ptr<MemoryCgroup>> cgroup =
      MemoryCgroup::Create("regions", kCgroupLimit);
  if (!cgroup.ok()) GTEST_SKIP() << cgroup.status().message();
  absl::StatusOr<std::unique_ptr<PsServerProcesses>> processes =
      PsServerProcesses::Start(/*shards=*/1, /*workers=*/2, /*max_message_bytes=*/256 << 20);
  ASSERT_TRUE(processes.ok()) << processes.status();
  const pid_t pid = (*processes)->pids()[0];
  ASSERT_TRUE((*cgroup)->Add(pid).ok());
  auto stub = ParameterServer::NewStub(grpc::CreateChannel((*processes)->addresses()[0],
                                                           grpc::InsecureChannelCredentials()));

  // Two attaches and a re-attach, each of a region larger than the cgroup.
  const int workers[] = {0, 1, 0};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    SparseObject object(i);
    ShmAttachRequest request;
    request.set_worker(workers[i]);
    request.set_name(object.name());
    request.set_bytes(kRegionBytes);
    request.set_boot_id(*HostBootId());
    request.set_proof(object.proof());
    ShmAttachResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Status status = stub->ShmAttach(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  StatsRequest stats_request;
  StatsResponse stats;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  EXPECT_TRUE(stub->Stats(&context, stats_request, &stats).ok()) << "the PS is gone";
  EXPECT_EQ(kill(pid, 0), 0) << "the PS was killed";
  absl::StatusOr<int64_t> usage = (*cgroup)->usage();
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_LT(*usage, 16 << 20) << "bytes charged to the PS's cgroup after the attaches";
  processes->reset();  // the cgroup goes once its process has
}

}  // namespace PST_FILE_ID
}  // namespace pst
