// row_step_bench as docs/benchmarks.md renders it: one JSON row whose
// phases add up to its step, over a table that grew. A short run: this
// checks the interface, not the figures.
#include <algorithm>
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

std::string Bin() { return absl::StrCat(PST_BIN_DIR, "/row_step_bench"); }

TEST(RowStepBenchTest, OneJsonRowWhosePhasesMakeItsStep) {
  const CommandResult run = RunCommand(
      Bin() + " --batch=32 --fields=4 --distinct=1000 --dims=4,1 --warm_steps=5 --steps=5 "
              "--rounds=1 --json",
      120);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<std::string> rows = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 1u) << run.out;
  const std::string& row = rows[0];
  EXPECT_EQ(JsonField(row, "benchmark"), "\"row_step_bench\"");
  EXPECT_EQ(JsonField(row, "dims"), "\"4,1\"");
  EXPECT_EQ(JsonField(row, "rounds"), "1");
  EXPECT_GT(std::stod(JsonField(row, "ids_per_step")), 0.0);
  // Ten steps of new ids leave more rows than one step names.
  EXPECT_GT(std::stod(JsonField(row, "rows_held")), std::stod(JsonField(row, "ids_per_step")));
  double phases = 0;
  for (const char* phase : {"land_us", "stage_us", "commit_us", "answer_us"}) {
    SCOPED_TRACE(phase);
    const double us = std::stod(JsonField(row, phase));
    EXPECT_GE(us, 0.0);
    EXPECT_LE(std::stod(JsonField(row, absl::StrCat(phase, "_min"))), us);
    EXPECT_GE(std::stod(JsonField(row, absl::StrCat(phase, "_max"))), us);
    phases += us;
  }
  // One round: its step is the sum of its phases, each printed to 1 us.
  EXPECT_NEAR(std::stod(JsonField(row, "step_us")), phases, 3.0);
  EXPECT_GT(phases, 0.0);
  EXPECT_GT(std::stod(JsonField(row, "rows_per_second")), 0.0);
}

TEST(RowStepBenchTest, BadFlagsAreOneLineAndExitCodeTwo) {
  for (const char* flags : {"--dims=8,x", "--ranks=0", "--distinct=1"}) {
    SCOPED_TRACE(flags);
    const CommandResult run = RunCommand(Bin() + " " + flags, 60);
    EXPECT_EQ(run.exit_code, 2);
    EXPECT_THAT(run.err, HasSubstr("row_step_bench: error: "));
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
