// PsServerProcesses: the shards it starts serve on the addresses it gives,
// their CPU time is counted, and destroying it stops them by PID and
// removes their files.
#include "benchmarks/ps_server_processes.h"

#include <signal.h>

#include <cerrno>
#include <filesystem>

#include "gtest/gtest.h"
#include "placement/variable_spec.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

TEST(PsServerProcessesTest, ShardsServeAndAreGoneOnceDestroyed) {
  absl::StatusOr<std::unique_ptr<PsServerProcesses>> processes =
      PsServerProcesses::Start(/*shards=*/2, /*workers=*/1, /*max_message_bytes=*/1 << 20);
  ASSERT_TRUE(processes.ok()) << processes.status();
  ASSERT_EQ((*processes)->addresses().size(), 2u);
  ASSERT_EQ((*processes)->pids().size(), 2u);
  const std::vector<pid_t> pids = (*processes)->pids();
  const std::string dir = (*processes)->dir();
  EXPECT_TRUE(std::filesystem::exists(dir));

  absl::StatusOr<std::unique_ptr<PsClient>> client =
      PsClient::Connect((*processes)->addresses(), 0, absl::Seconds(10));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({VariableSpec{"w", {64, 1024}}});
  std::vector<float> values(64 * 1024, 1.0f);
  ASSERT_TRUE((*client)->Init({values}).ok());
  for (int i = 0; i < 50; ++i) {
    std::vector<int64_t> versions;
    ASSERT_TRUE(
        (*client)
            ->Exchange({.min_versions = {0, 0}, .timeout = absl::Seconds(10), .values = {values}},
                       &versions, nullptr)
            .ok());
  }
  EXPECT_GT((*processes)->CpuSeconds(), 0.0);
  client->reset();

  processes->reset();
  for (pid_t pid : pids) {
    EXPECT_EQ(kill(pid, 0), -1) << "ps_server " << pid << " is still running";
    EXPECT_EQ(errno, ESRCH);
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace PST_FILE_ID
}  // namespace pst
