// socket_bench as data_plane.py and a reader comparing with it use it: rows
// with ps_bench's field names, which ps_bench takes as --peer_json. Short
// rows: this checks the interface, not the figures (docs/benchmarks.md).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

TEST(SocketBenchTest, JsonRowsCarryPsBenchsFields) {
  const CommandResult run = RunCommand(
      Bin("socket_bench") + " --sizes=4KiB,1MiB --workers=2 --seconds=0.3 --json", 120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<std::string> rows = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 2u) << run.out;
  const char* kSizes[] = {"4KiB", "1MiB"};
  const char* kBytes[] = {"4096", "1048576"};
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(rows[i]);
    EXPECT_EQ(JsonField(rows[i], "size"), absl::StrCat("\"", kSizes[i], "\""));
    EXPECT_EQ(JsonField(rows[i], "size_bytes"), kBytes[i]);
    EXPECT_EQ(JsonField(rows[i], "workers"), "2");
    EXPECT_EQ(JsonField(rows[i], "transport"), "\"socket\"");
    EXPECT_GT(std::stoll(JsonField(rows[i], "round_trips")), 0);
    EXPECT_GE(std::stod(JsonField(rows[i], "push_pull_gbps")), 0.0);
    EXPECT_GT(std::stod(JsonField(rows[i], "p50_us")), 0.0);
    EXPECT_GT(std::stod(JsonField(rows[i], "cpu_us_per_round_trip")), 0.0);
  }
}

TEST(SocketBenchTest, ItsRowsArePsBenchsPeer) {
  const CommandResult socket =
      RunCommand(Bin("socket_bench") + " --sizes=1MiB --seconds=0.3 --json", 120);
  ASSERT_EQ(socket.exit_code, 0) << socket.err;
  const std::string path = ::testing::TempDir() + "/socket_peer.json";
  std::ofstream(path) << socket.out;
  const CommandResult ours = RunCommand(
      Bin("ps_bench") + " --sizes=1MiB --transport=tcp --seconds=0.3 --json --iperf=false "
                        "--peer_json=" + path,
      120);
  std::remove(path.c_str());
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  EXPECT_EQ(std::stod(JsonField(ours.out, "peer_gbps")), std::stod(JsonField(socket.out, "push_pull_gbps")));
  EXPECT_GT(std::stod(JsonField(ours.out, "vs_peer")), 0.0);
  EXPECT_GT(std::stod(JsonField(ours.out, "cpu_vs_peer")), 0.0);
}

TEST(SocketBenchTest, BadFlagsAreOneLineAndExitCodeTwo) {
  CommandResult run = RunCommand(Bin("socket_bench") + " --sizes=4KiB,7XB", 60);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--sizes: cannot read \"7XB\""));
  EXPECT_EQ(run.out, "");
  run = RunCommand(Bin("socket_bench") + " --sizes=6B", 60);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("not a float32 model"));
  run = RunCommand(Bin("socket_bench") + " --block=6", 60);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--block must be a positive multiple of 4 bytes"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
