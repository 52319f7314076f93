// ps_bench as scripts use it: the flags the issue fixes, and one JSON object
// per row with the fields they read. Short rows without iperf3: this checks
// the interface, not the figures (docs/benchmarks.md has those).
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

TEST(PsBenchTest, JsonRowsCarryTheFieldsScriptsRead) {
  const CommandResult run = RunCommand(
      Bin("ps_bench") + " --sizes=4KiB,3MiB --workers=2 --shards=2 --wire_dtype=bf16 "
                        "--seconds=0.3 --json --iperf=false",
      120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<std::string> rows = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 2u) << run.out;
  const struct {
    const char* size;
    int64_t elements;  // of the model ps_bench builds for that size
  } kRows[] = {{"4KiB", 1024}, {"3MiB", 3 << 18}};
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(rows[i]);
    EXPECT_EQ(JsonField(rows[i], "size"), absl::StrCat("\"", kRows[i].size, "\""));
    EXPECT_EQ(JsonField(rows[i], "workers"), "2");
    EXPECT_EQ(JsonField(rows[i], "shards"), "2");
    EXPECT_EQ(JsonField(rows[i], "wire_dtype"), "\"bfloat16\"");
    // A number; a 4 KiB row's can round to 0.000 on a loaded machine.
    EXPECT_GE(std::stod(JsonField(rows[i], "push_pull_gbps")), 0.0);
    EXPECT_GT(std::stoll(JsonField(rows[i], "round_trips")), 0);
    const double p50 = std::stod(JsonField(rows[i], "p50_us"));
    EXPECT_GT(p50, 0.0);
    EXPECT_GE(std::stod(JsonField(rows[i], "p99_us")), p50);
    // bf16 halves the bytes of a push and of a pull.
    EXPECT_EQ(JsonField(rows[i], "wire_bytes_per_round_trip"), absl::StrCat(2 * 2 * kRows[i].elements));
    EXPECT_EQ(JsonField(rows[i], "bytes_saved_vs_fp32"), absl::StrCat(2 * 2 * kRows[i].elements));
    EXPECT_EQ(JsonField(rows[i], "iperf3_gbps"), "null");
    EXPECT_EQ(JsonField(rows[i], "of_iperf3"), "null");
    EXPECT_GT(std::stod(JsonField(rows[i], "echo_p50_us")), 0.0);
    EXPECT_EQ(JsonField(rows[i], "exchange"), "\"push_pull\"");
  }
}

TEST(PsBenchTest, TheExchangeCanBeAPushThenAPull) {
  const CommandResult run = RunCommand(
      Bin("ps_bench") + " --sizes=2MiB --exchange=push_then_pull --seconds=0.3 --json "
                        "--iperf=false",
      120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(JsonField(run.out, "exchange"), "\"push_then_pull\"");
  EXPECT_GT(std::stoll(JsonField(run.out, "round_trips")), 0);
}

// As scripts/netns_cluster.sh starts several: each says it is ready on the
// file, and measures once a line arrives on its standard input.
TEST(PsBenchTest, WithAReadyFileItSaysSoThenWaitsForTheStartSignal) {
  const std::string ready = absl::StrCat(::testing::TempDir(), "/ps_bench_ready");
  std::remove(ready.c_str());
  CommandResult run = RunCommand(
      // Under sh -c: RunCommand gives the whole command /dev/null as its stdin.
      absl::StrCat("sh -c 'echo go | ", Bin("ps_bench"), " --sizes=4KiB --seconds=0.2 --json ",
                   "--iperf=false --first_worker=1 --ready_file=", ready, "'"),
      120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_GT(std::stoll(JsonField(run.out, "round_trips")), 0);
  std::ifstream file(ready);
  std::string line;
  ASSERT_TRUE(std::getline(file, line));
  EXPECT_THAT(line, HasSubstr(" ready"));

  run = RunCommand(absl::StrCat(Bin("ps_bench"), " --sizes=4KiB --seconds=0.2 --json ",
                                "--iperf=false --ready_file=", ready),
                   120);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("standard input closed before the start signal"));
  EXPECT_EQ(run.out, "");
  std::remove(ready.c_str());
}

TEST(PsBenchTest, BadExchangeOrSeveralSizesForRunningShardsAreOneLine) {
  CommandResult run = RunCommand(Bin("ps_bench") + " --exchange=both --iperf=false", 60);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--exchange=both: use push_pull or push_then_pull"));
  run = RunCommand(Bin("ps_bench") + " --ps=127.0.0.1:1 --sizes=4KiB,4MiB --iperf=false", 60);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--ps: give one size"));
}

TEST(PsBenchTest, ABadSizeIsOneLineAndExitCodeTwo) {
  const CommandResult run = RunCommand(Bin("ps_bench") + " --sizes=4KiB,7XB --iperf=false", 60);
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--sizes: cannot read \"7XB\""));
  EXPECT_EQ(run.out, "");
}

}  // namespace PST_FILE_ID
}  // namespace pst
