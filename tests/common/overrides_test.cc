// The overrides table: which program takes which override, how a given
// one applies, and what --help lists.
#include "common/overrides.h"

#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Status Parse(std::vector<std::string> args, Program program) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return CheckCommandLine(static_cast<int>(argv.size()), argv.data(), program);
}

TEST(OverridesTest, EveryOverrideIsTakenBySomeTaskOrTool) {
  for (const Override& entry : Overrides()) {
    SCOPED_TRACE(entry.name());
    EXPECT_NE(entry.programs, 0u);
    EXPECT_EQ(FindOverride(entry.name()), &entry);
    EXPECT_EQ(entry.to_config != nullptr, entry.target == Target::kConfig);
    EXPECT_EQ(entry.to_limits != nullptr, entry.target == Target::kLimits);
    // pslaunch takes whatever a task of its takes.
    if (entry.Takes(kPsServer) || entry.Takes(kWorker)) {
      EXPECT_TRUE(entry.Takes(kPslaunch));
    }
    EXPECT_FALSE(entry.Given());  // nothing set in this test binary
  }
}

TEST(OverridesTest, TheLimitsFlagsDefaultToTheLimitsDefaults) {
  const RpcLimits flags = RpcLimitsFromFlags();
  const RpcLimits defaults;
  EXPECT_EQ(flags.max_request_bytes, defaults.max_request_bytes);
  EXPECT_EQ(flags.max_reply_bytes, defaults.max_reply_bytes);
  EXPECT_EQ(flags.max_pull_wait, defaults.max_pull_wait);
  EXPECT_EQ(flags.max_connections_per_source, defaults.max_connections_per_source);
  EXPECT_EQ(flags.connection_idle_timeout, defaults.connection_idle_timeout);
  EXPECT_EQ(flags.max_server_threads, defaults.max_server_threads);
}

TEST(OverridesTest, AGivenLimitReachesTheLimits) {
  absl::FlagSaver restore;
  ASSERT_TRUE(Parse({"ps_server", "--max_streams=7", "--handshake_timeout_seconds=2.5"},
                    kPsServer)
                  .ok());
  const RpcLimits limits = RpcLimitsFromFlags();
  EXPECT_EQ(limits.max_streams, 7);
  EXPECT_EQ(limits.handshake_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(limits.max_streams_per_worker, RpcLimits().max_streams_per_worker);
}

TEST(OverridesTest, AProgramRefusesAnOverrideItDoesNotTakeInOneLine) {
  absl::FlagSaver restore;
  absl::Status refused = Parse({"worker", "--max_streams=7"}, kWorker);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "unknown flag --max_streams: worker does not take it (a flag of ps_server and "
            "pslaunch); see --help");
  EXPECT_TRUE(Parse({"psctl", "--connect_timeout_seconds=3"}, kPsctl).ok());
  EXPECT_FALSE(Parse({"psreport", "--mode=async"}, kPsreport).ok());
}

TEST(OverridesTest, OnlyGivenConfigOverridesApplyInTheTablesOrder) {
  absl::FlagSaver restore;
  ASSERT_TRUE(Parse({"worker", "--shm=off", "--epochs=3", "--staleness=-1"}, kWorker).ok());
  const ConfigOverrides given = OverridesFromFlags();
  ASSERT_EQ(given.size(), 2u);  // -1 is --staleness's default: no override
  EXPECT_EQ(given[0].flag, "epochs");
  EXPECT_EQ(given[1].flag, "shm");
  JobConfig config;
  ASSERT_TRUE(ApplyOverrides(given, &config).ok());
  EXPECT_EQ(config.training().epochs(), 3);
  EXPECT_EQ(config.cluster().shm(), SHM_OFF);
}

TEST(OverridesTest, CheckpointsAreSetWithoutAConfigFile) {
  absl::FlagSaver restore;
  ASSERT_TRUE(
      Parse({"pslaunch", "--checkpoint_dir=/tmp/ckpt", "--checkpoint_every_steps=50"}, kPslaunch)
          .ok());
  JobConfig config;
  config.mutable_training()->mutable_checkpoint()->set_every_seconds(30);
  ASSERT_TRUE(ApplyOverrides(OverridesFromFlags(), &config).ok());
  EXPECT_EQ(config.training().checkpoint().dir(), "/tmp/ckpt");
  EXPECT_EQ(config.training().checkpoint().every_steps(), 50);
  EXPECT_EQ(config.training().checkpoint().every_seconds(), 30);  // the config's, kept
}

TEST(OverridesTest, ARefusedValueIsOneLineNamingItsFlag) {
  JobConfig config;
  absl::Status refused = ApplyOverrides({*ConfigOverrideOf("shm", "maybe")}, &config);
  EXPECT_EQ(refused.message(), "--shm: unknown setting \"maybe\"; use auto or off");
  refused = ApplyOverrides({*ConfigOverrideOf("epochs", "three")}, &config);
  EXPECT_THAT(refused.message(), HasSubstr("--epochs: \"three\""));
  EXPECT_FALSE(ConfigOverrideOf("max_streams", "3").ok());
}

TEST(OverridesTest, HelpListsWhatTheProgramTakes) {
  const std::string worker = HelpText("worker", "usage", kWorker);
  EXPECT_THAT(worker, HasSubstr("    --mode (Override training.mode"));
  EXPECT_THAT(worker, HasSubstr("    --connect_timeout_seconds ("));
  EXPECT_THAT(worker, Not(HasSubstr("--max_streams (")));
  EXPECT_THAT(worker, HasSubstr("    --config ("));
  const std::string launcher = HelpText("pslaunch", "usage", kPslaunch);
  for (const Override& entry : Overrides()) {
    if (entry.Takes(kPslaunch)) {
      EXPECT_THAT(launcher, HasSubstr(absl::StrCat("    --", entry.name(), " (")));
    }
  }
  EXPECT_THAT(launcher, HasSubstr("Limits of the PS (passed on to every ps_server):"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
