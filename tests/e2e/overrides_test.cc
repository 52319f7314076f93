// The shipped programs against the overrides table: each accepts every
// override the table says it takes and refuses the others, and pslaunch
// takes every flag of ps_server and worker except those it sets per task.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/overrides.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/commands.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

struct Binary {
  std::string name;
  Program program;
};
const Binary kTasks[] = {{"ps_server", kPsServer}, {"worker", kWorker}};
const Binary kPrograms[] = {{"ps_server", kPsServer}, {"worker", kWorker}, {"pslaunch", kPslaunch}};

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The flags a program's --help lists ("    --name (...").
std::set<std::string> HelpFlags(const std::string& program) {
  CommandResult help = RunCommand(Bin(program) + " --help", 60);
  EXPECT_EQ(help.exit_code, 0) << help.err;
  std::set<std::string> flags;
  for (absl::string_view line : absl::StrSplit(help.out, '\n')) {
    if (!absl::ConsumePrefix(&line, "    --")) continue;
    flags.insert(std::string(line.substr(0, line.find(' '))));
  }
  return flags;
}

TEST(OverridesE2eTest, EachProgramTakesTheOverridesTheTableGivesIt) {
  for (const Binary& binary : kPrograms) {
    SCOPED_TRACE(binary.name);
    std::string command = Bin(binary.name) + " --check_config";
    for (const Override& entry : Overrides()) {
      if (entry.Takes(binary.program)) {
        absl::StrAppend(&command, " '--", entry.name(), "=", entry.flag->DefaultValue(), "'");
      }
    }
    CommandResult checked = RunCommand(command, 60);
    EXPECT_EQ(checked.exit_code, 0) << command << "\n" << checked.err;
    EXPECT_THAT(checked.out, HasSubstr("config OK"));
  }
}

TEST(OverridesE2eTest, EachTaskRefusesTheOverridesItDoesNotTakeInOneLine) {
  for (const Binary& binary : kTasks) {
    for (const Override& entry : Overrides()) {
      if (entry.Takes(binary.program)) continue;
      SCOPED_TRACE(absl::StrCat(binary.name, " --", entry.name()));
      CommandResult refused = RunCommand(
          absl::StrCat(Bin(binary.name), " '--", entry.name(), "=", entry.flag->DefaultValue(), "'"),
          60);
      EXPECT_EQ(refused.exit_code, 2);
      EXPECT_THAT(refused.err, ::testing::StartsWith(absl::StrCat(
                                   binary.name, ": error: unknown flag --", entry.name(), ": ",
                                   binary.name, " does not take it (a flag of ")));
      EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
    }
  }
}

TEST(OverridesE2eTest, PslaunchTakesEveryFlagOfItsTasksButThePerTaskOnes) {
  // What pslaunch sets for each task itself (or, --listen and --exit_when_done, a task
  // started by hand: pslaunch stops its shards itself once the workers end).
  const std::set<std::string> per_task = {
      "config",    "check_config", "task",         "replica",         "listen",
      "port_file", "result_file",  "metrics_port", "metrics_address", "exit_when_done"};
  const std::set<std::string> launcher = HelpFlags("pslaunch");
  for (const Binary& binary : kTasks) {
    for (const std::string& flag : HelpFlags(binary.name)) {
      SCOPED_TRACE(absl::StrCat(binary.name, " --", flag));
      if (per_task.count(flag) > 0) continue;
      EXPECT_EQ(launcher.count(flag), 1u) << "pslaunch does not take it";
      const Override* entry = FindOverride(flag);
      ASSERT_NE(entry, nullptr) << "not in the overrides table, so pslaunch cannot pass it on";
      EXPECT_TRUE(entry->Takes(binary.program));
    }
  }
}

// --check_config opens what the workers would read: a data set that is not
// there fails it in one line, exit code 2, as it would fail the workers.
TEST(OverridesE2eTest, CheckConfigRefusesADataSetThatIsNotThereInOneLine) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/check_config_data.", getpid());
  std::filesystem::create_directories(dir);
  const std::string job = dir + "/job.textproto";
  std::ofstream(job) << "cluster { ps: \"127.0.0.1:7000\" workers: 1 }\n"
                        "training { optimizer { sgd { learning_rate: 0.1 } }\n"
                        "  model { mlp { hidden: 8 } }\n"
                        "  dataset { fashion_mnist { dir: \"" << dir << "/absent\" } } }\n";
  for (const char* program : {"worker --task=worker:0", "pslaunch"}) {
    SCOPED_TRACE(program);
    const CommandResult missing =
        RunCommand(absl::StrCat(Bin(program), " --check_config --config=", job), 60);
    EXPECT_EQ(missing.exit_code, 2) << missing.out << missing.err;
    EXPECT_THAT(missing.err, HasSubstr(absl::StrCat("training.dataset.fashion_mnist.dir: ", dir,
                                                    "/absent/train-images-idx3-ubyte.gz does not exist")));
    EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1) << missing.err;
  }
  // The same job with the folder in place passes (the check reads no data).
  std::filesystem::create_directories(dir + "/absent");
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    std::ofstream(absl::StrCat(dir, "/absent/", name)) << "";
  }
  const CommandResult present =
      RunCommand(absl::StrCat(Bin("worker --task=worker:0"), " --check_config --config=", job), 60);
  EXPECT_EQ(present.exit_code, 0) << present.err;
  EXPECT_THAT(present.out, HasSubstr("config OK"));
  std::filesystem::remove_all(dir);
}

}  // namespace PST_FILE_ID
}  // namespace pst
