// Replicated shards under pslaunch: configs/ctr.textproto, scaled down,
// with a backup per shard (cluster.ps_backups, ports the system picks;
// pslaunch runs the membership's etcd). SYNC trains as without backups, to
// the last digit of the summary, and each backup's final checkpoint holds
// bitwise its primary's variables, rows and optimizer state; so it does
// when a primary is killed with SIGKILL mid-run and its backup takes over,
// and the summary is the same when a primary is killed as the job starts.
// In ASYNC, every push a worker made is applied exactly once across the
// failover. With the job's etcd killed mid-run, training goes on, and when
// etcd is back the run ends as without the outage. Without backups, a
// shard killed and restarted from its checkpoint stalls no worker.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "ps_server/core/checkpoint.h"
#include "psctl/model_export.h"
#include "result.pb.h"
#include "tests/cluster/membership/etcd_server.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"
#include "tests/support/shard_stats.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) { return absl::StrCat(PST_BIN_DIR, "/", name); }

// The shipped CTR config with ports the system picks, its data and
// checkpoints in `dir`, fewer examples, and `cluster_extra` in its cluster.
std::string CtrConfig(const std::string& dir, const std::string& name,
                      const std::string& cluster_extra, int train_examples = 30000) {
  std::string text = ReadFile(absl::StrCat(PST_SOURCE_DIR, "/configs/ctr.textproto"));
  const int replaced = absl::StrReplaceAll(
      {{"127.0.0.1:50061", "127.0.0.1:0"},
       {"127.0.0.1:50062", "127.0.0.1:0"},
       {"  workers: 2\n", absl::StrCat("  workers: 2\n", cluster_extra)},
       {"  seed: 1\n",
        absl::StrCat("  seed: 1\n  checkpoint { dir: \"", dir, "/", name, "-checkpoints\" }\n")},
       {"/tmp/pstrain-ctr", dir},
       {"train_examples: 500000", absl::StrCat("train_examples: ", train_examples)},
       {"test_examples: 50000", "test_examples: 5000"},
       {"distinct: 100000", "distinct: 20000"}},
      &text);
  EXPECT_EQ(replaced, 9) << "configs/ctr.textproto changed: update this test's replacements";
  const std::string path = absl::StrCat(dir, "/", name, ".textproto");
  std::ofstream(path) << text;
  return path;
}

// A folder of the test's own, empty at the start and removed at the end
// unless the test failed (ScratchDir then keeps it, to be looked at).
struct ScratchFolder {
  explicit ScratchFolder(const std::string& name) : path(absl::StrCat(ScratchDir(), "/", name)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchFolder() {
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path);
  }
  const std::string path;
};

// The newest checkpoint that restores in `dir`.
ShardCheckpoint Newest(const std::string& dir) {
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dir, &rejected);
  EXPECT_TRUE(checkpoint.ok()) << dir << ": " << checkpoint.status();
  return checkpoint.ok() ? *std::move(checkpoint) : ShardCheckpoint();
}

// A table's rows by id: values, optimizer state and update count, as bytes.
std::map<uint64_t, std::tuple<std::string, std::string, std::string>> RowsOf(
    const ShardCheckpoint::Embedding& table) {
  std::map<uint64_t, std::tuple<std::string, std::string, std::string>> rows;
  const size_t n = table.ids().size() / sizeof(uint64_t);
  const size_t values = n > 0 ? table.values().size() / n : 0;
  const size_t slots = n > 0 ? table.slots().size() / n : 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t id;
    std::memcpy(&id, table.ids().data() + i * sizeof(id), sizeof(id));
    rows[id] = {table.values().substr(i * values, values), table.slots().substr(i * slots, slots),
                table.row_updates().substr(i * sizeof(int64_t), sizeof(int64_t))};
  }
  return rows;
}

// The summary line's AUC, loss and steps, as printed.
std::string Summary(const CommandResult& run) {
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  if (lines.empty()) return "";
  RunSummary summary;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(lines.back(), &summary).ok())
      << lines.back();
  return absl::StrCat(summary.test_auc(), " ", summary.test_logloss(), " ", summary.steps());
}

// Each backup's final checkpoint under `dir`/`name`-checkpoints holds
// bitwise its primary's variables, rows and optimizer state.
void ExpectBackupsEndAsTheirPrimaries(const std::string& dir, const std::string& name) {
  for (int shard = 0; shard < 2; ++shard) {
    SCOPED_TRACE(absl::StrCat("shard ", shard));
    const ShardCheckpoint primary =
        Newest(absl::StrCat(dir, "/", name, "-checkpoints/shard-", shard));
    const ShardCheckpoint backup =
        Newest(absl::StrCat(dir, "/", name, "-checkpoints/replica-1/shard-", shard));
    EXPECT_GT(primary.version(), 0);
    EXPECT_EQ(backup.version(), primary.version());
    ASSERT_EQ(backup.variables_size(), primary.variables_size());
    for (int v = 0; v < primary.variables_size(); ++v) {
      EXPECT_EQ(backup.variables(v).SerializeAsString(), primary.variables(v).SerializeAsString())
          << primary.variables(v).name();
    }
    // The CTR config's deep and wide tables, kept as one table of parts
    // (CtrShardTables, common/ctr_config.h).
    ASSERT_EQ(primary.embeddings_size(), 1);
    ASSERT_EQ(backup.embeddings_size(), 1);
    EXPECT_EQ(primary.embeddings(0).config().parts_size(), 2);
    for (int t = 0; t < primary.embeddings_size(); ++t) {
      EXPECT_GT(primary.embeddings(t).ids().size(), 0u);
      EXPECT_TRUE(RowsOf(backup.embeddings(t)) == RowsOf(primary.embeddings(t)))
          << primary.embeddings(t).config().name();
      EXPECT_EQ(backup.embeddings(t).updates(), primary.embeddings(t).updates());
    }
  }
}

TEST(ReplicationTest, SyncWithABackupPerShardTrainsAsWithoutAndTheBackupsEndAsTheirPrimaries) {
  const ScratchFolder scratch("replication");
  const std::string& dir = scratch.path;
  const std::string plain = CtrConfig(dir, "plain", "");
  const std::string replicated = CtrConfig(
      dir, "replicated",
      "  ps_backups { address: \"127.0.0.1:0\" }\n  ps_backups { address: \"127.0.0.1:0\" }\n");

  const CommandResult without =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", plain, " --mode=sync"), 500);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  const CommandResult with =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", replicated, " --mode=sync"), 500);
  ASSERT_EQ(with.exit_code, 0) << with.err;
  EXPECT_THAT(with.err, HasSubstr("ps:0:1"));
  EXPECT_THAT(with.err, HasSubstr("ps:1:1"));
  EXPECT_EQ(Summary(with), Summary(without));
  ExpectBackupsEndAsTheirPrimaries(dir, "replicated");
}

// With a message limit far below a shard's state (about 7 MB a shard) and
// below a version's update (the dense variables and the rows it changed,
// about 360 KB), both travel in pieces: the backups catch up and end as
// their primaries.
TEST(ReplicationTest, UpdatesLargerThanAMessageReachTheBackupsInPieces) {
  const ScratchFolder scratch("replication-pieces");
  const std::string& dir = scratch.path;
  const std::string replicated = CtrConfig(
      dir, "replicated",
      "  ps_backups { address: \"127.0.0.1:0\" }\n  ps_backups { address: \"127.0.0.1:0\" }\n");
  const CommandResult with = RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", replicated,
                                                     " --mode=sync --max_message_bytes=262144"),
                                        500);
  ASSERT_EQ(with.exit_code, 0) << with.err;
  EXPECT_THAT(with.err, ::testing::Not(HasSubstr("did not take version"))) << with.err;
  ExpectBackupsEndAsTheirPrimaries(dir, "replicated");
}

constexpr char kBackups[] =
    "  ps_backups { address: \"127.0.0.1:0\" }\n  ps_backups { address: \"127.0.0.1:0\" }\n";

// `run`'s summary: the last line of its output that is one.
std::string SummaryIn(const std::string& output) {
  std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    if (absl::StartsWith(*line, "{\"mode\""))
      return Summary({.exit_code = 0, .out = *line, .err = ""});
  }
  return "";
}

// pslaunch in the background, its output in a log; stopped (SIGTERM, then
// SIGKILL) if a test ends before it does, so no task outlives the test.
class Launch {
 public:
  Launch(const std::string& config, const std::string& mode, const std::string& log)
      : log_(log),
        process_(
            {Bin("pslaunch"), absl::StrCat("--config=", config), absl::StrCat("--mode=", mode)},
            log) {}
  ~Launch() {
    if (exit_code_ >= 0) return;
    process_.Signal(SIGTERM);
    if (process_.Wait(absl::Seconds(30)) < 0) process_.Kill();
  }
  std::string Output() const { return ReadFile(log_); }
  // The first match of `pattern`'s group 1 in the log, waited for up to `timeout`.
  std::string AwaitInLog(const std::string& pattern, absl::Duration timeout) const {
    const std::regex re(pattern);
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      std::smatch match;
      const std::string text = Output();
      if (std::regex_search(text, match, re)) return match[1];
      if (AwaitProcessEnd(process_.pid(), absl::Milliseconds(50))) return "";
    }
    return "";
  }
  int Wait(absl::Duration timeout) {
    exit_code_ = process_.Wait(timeout);
    return exit_code_;
  }

 private:
  const std::string log_;
  ChildProcess process_;
  int exit_code_ = -1;
};

// Runs `config` under pslaunch and kills shard 0's primary with SIGKILL
// once its version reaches `kill_at`; the run's output.
std::string RunKillingShardZerosPrimary(const std::string& config, const std::string& mode,
                                        const std::string& log, int64_t kill_at) {
  Launch launch(config, mode, log);
  const std::string address = launch.AwaitInLog(R"(info ps:0 serving (\S+))", absl::Seconds(60));
  const std::string pid_text = launch.AwaitInLog(R"(ps:0 \(pid (\d+)\))", absl::Seconds(60));
  int pid = 0;
  EXPECT_FALSE(address.empty()) << launch.Output();
  EXPECT_TRUE(absl::SimpleAtoi(pid_text, &pid)) << launch.Output();
  if (address.empty() || pid <= 0) return launch.Output();
  // Mid-run: once the shard has taken `kill_at` updates (polled: the
  // shard's version is the event).
  EXPECT_GE(AwaitVersion(address, kill_at, absl::Seconds(120)), kill_at)
      << "the run did not reach version " << kill_at;
  // A backup still catching up may not take the office: with backups, the
  // kill waits for them to be in the chain.
  if (ReadFile(config).find("ps_backups") != std::string::npos) {
    EXPECT_TRUE(AwaitBackupsInChain(address, absl::Seconds(120))) << launch.Output();
  }
  EXPECT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(launch.Wait(absl::Seconds(400)), 0) << launch.Output();
  return launch.Output();
}

// A checkpoint's version and variables, and its rows and their optimizer
// state, as bytes.
std::string StateOf(const ShardCheckpoint& checkpoint) {
  std::string state = absl::StrCat(checkpoint.version(), "\n");
  for (const auto& variable : checkpoint.variables()) state += variable.SerializeAsString();
  for (const auto& table : checkpoint.embeddings()) {
    for (const auto& [id, row] : RowsOf(table)) {
      absl::StrAppend(&state, id, std::get<0>(row), std::get<1>(row), std::get<2>(row));
    }
  }
  return state;
}

// The state of the newest checkpoint in `dir`.
std::string StateOf(const std::string& dir) { return StateOf(Newest(dir)); }

// Where a replica restarted mid-run was still catching up when the run
// ended, its folder holds an older version than the final one, or nothing;
// what it holds at the final version is the final state.
void ExpectFinalOrBehind(const std::string& dir, const ShardCheckpoint& final_state) {
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> newest = ReadNewestValidCheckpoint(dir, &rejected);
  if (!newest.ok()) return;
  EXPECT_LE(newest->version(), final_state.version()) << dir;
  if (newest->version() == final_state.version()) {
    EXPECT_TRUE(StateOf(*newest) == StateOf(final_state)) << dir;
  }
}

TEST(ReplicationTest, SyncLosesNothingWhenAPrimaryIsKilledMidRun) {
  const ScratchFolder scratch("failover-sync");
  const std::string& dir = scratch.path;
  const std::string plain = CtrConfig(dir, "plain", "", 90000);
  const std::string replicated = CtrConfig(dir, "replicated", kBackups, 90000);

  const CommandResult without =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", plain, " --mode=sync"), 500);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  const std::string output =
      RunKillingShardZerosPrimary(replicated, "sync", absl::StrCat(dir, "/replicated.log"), 60);
  EXPECT_THAT(output, HasSubstr("task ps:0 exited with code 137"));
  EXPECT_EQ(SummaryIn(output), Summary(without)) << output;

  // The replicas that ended the run hold bitwise the failure-free run's
  // final state (variables, rows, optimizer state, update counts), and it
  // is what the model is exported from: shard 0's backup, which took over,
  // and both of shard 1's. Shard 0's killed primary came back as a backup;
  // caught up before the run ended, it holds the final state too.
  const std::string replicated_dir = absl::StrCat(dir, "/replicated-checkpoints");
  absl::StatusOr<std::vector<ShardCheckpoint>> exported = ReadShardCheckpoints(replicated_dir);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->size(), 2u);
  for (int shard = 0; shard < 2; ++shard) {
    SCOPED_TRACE(absl::StrCat("shard ", shard));
    const std::string expected = StateOf(absl::StrCat(dir, "/plain-checkpoints/shard-", shard));
    EXPECT_TRUE(StateOf((*exported)[shard]) == expected);
    EXPECT_TRUE(StateOf(absl::StrCat(replicated_dir, "/replica-1/shard-", shard)) == expected);
  }
  EXPECT_TRUE(StateOf(absl::StrCat(replicated_dir, "/shard-1")) ==
              StateOf(absl::StrCat(dir, "/plain-checkpoints/shard-1")));
  ExpectFinalOrBehind(absl::StrCat(replicated_dir, "/shard-0"), (*exported)[0]);
}

// Shard 0's primary killed as the job starts, the moment it holds the
// shard's first office (before its backup can hold the Init's state): it
// has told no worker of anything, so pslaunch restarts it, it takes the
// office again as for a new job, and the run ends as without the kill.
TEST(ReplicationTest, SyncLosesNothingWhenAPrimaryIsKilledAsTheJobStarts) {
  const ScratchFolder scratch("failover-at-start");
  const std::string& dir = scratch.path;
  const std::string plain = CtrConfig(dir, "plain", "");
  const std::string replicated = CtrConfig(dir, "replicated", kBackups);

  const CommandResult without =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", plain, " --mode=sync"), 500);
  ASSERT_EQ(without.exit_code, 0) << without.err;
  Launch launch(replicated, "sync", absl::StrCat(dir, "/replicated.log"));
  const std::string pid_text = launch.AwaitInLog(R"(ps:0 \(pid (\d+)\))", absl::Seconds(60));
  int pid = 0;
  ASSERT_TRUE(absl::SimpleAtoi(pid_text, &pid)) << launch.Output();
  ASSERT_EQ(launch.AwaitInLog(R"(shard 0 replica 0 is primary at epoch (\d+))", absl::Seconds(60)),
            "1")
      << launch.Output();
  EXPECT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(launch.Wait(absl::Seconds(400)), 0) << launch.Output();
  const std::string output = launch.Output();
  EXPECT_THAT(output, HasSubstr("task ps:0 exited with code 137"));
  // Replica 0 again, or the backup where the first chain was out before the kill.
  EXPECT_TRUE(std::regex_search(output, std::regex("shard 0 replica [01] is primary at epoch 2")))
      << output;
  EXPECT_EQ(SummaryIn(output), Summary(without)) << output;
}

// `config` with a checkpoint every 10 versions.
void CheckpointEveryTenVersions(const std::string& config) {
  std::string text = ReadFile(config);
  ASSERT_EQ(absl::StrReplaceAll({{"-checkpoints\" }", "-checkpoints\" every_steps: 10 }"}}, &text),
            1);
  std::ofstream(config) << text;
}

// The version of the newest checkpoint file in `dir`; -1 if none.
int64_t NewestFileVersion(const std::string& dir) {
  const std::vector<std::string> files = ListCheckpoints(dir);
  if (files.empty()) return -1;
  const std::optional<CheckpointName> name =
      ParseCheckpointName(std::filesystem::path(files.front()).filename().string());
  return name ? name->version : -1;
}

// Every replica of shard 0 killed at once: pslaunch restarts them, replica
// 0 restores its newest checkpoint and takes the office, the backup catches
// up from it, and training ends; the two replicas end bitwise equal.
TEST(ReplicationTest, AShardThatLostEveryReplicaGoesOnFromItsCheckpoint) {
  const ScratchFolder scratch("restore-replicated");
  const std::string& dir = scratch.path;
  const std::string replicated = CtrConfig(dir, "replicated", kBackups);
  CheckpointEveryTenVersions(replicated);

  Launch launch(replicated, "sync", absl::StrCat(dir, "/replicated.log"));
  const std::string address = launch.AwaitInLog(R"(info ps:0 serving (\S+))", absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launch.Output();
  int pids[2] = {0, 0};
  ASSERT_TRUE(
      absl::SimpleAtoi(launch.AwaitInLog(R"(ps:0 \(pid (\d+)\))", absl::Seconds(60)), &pids[0]))
      << launch.Output();
  ASSERT_TRUE(
      absl::SimpleAtoi(launch.AwaitInLog(R"(ps:0:1 \(pid (\d+)\))", absl::Seconds(60)), &pids[1]))
      << launch.Output();
  ASSERT_GE(AwaitVersion(address, 45, absl::Seconds(120)), 45) << launch.Output();
  for (const int pid : pids) EXPECT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(launch.Wait(absl::Seconds(400)), 0) << launch.Output();
  const std::string output = launch.Output();
  EXPECT_THAT(output, HasSubstr("task ps:0 exited with code 137"));
  EXPECT_THAT(output, HasSubstr("task ps:0:1 exited with code 137"));
  EXPECT_THAT(output, ::testing::ContainsRegex("ps:0 restored its checkpoint at version [1-9]"));
  // Replica 0 ended the run as primary; the backup, back empty, holds its
  // final state if it caught up before the end.
  const ShardCheckpoint final_state = Newest(absl::StrCat(dir, "/replicated-checkpoints/shard-0"));
  EXPECT_TRUE(final_state.finished());
  ExpectFinalOrBehind(absl::StrCat(dir, "/replicated-checkpoints/replica-1/shard-0"), final_state);
}

// Shard 0's primary killed, its backup takes the office and checkpoints on
// in its own folder; then every replica is killed. Replica 0 restores the
// backup's later checkpoint, not its own older one: the versions between
// are not lost.
TEST(ReplicationTest, AShardThatLostEveryReplicaAfterAFailoverGoesOnFromItsBackupsCheckpoint) {
  const ScratchFolder scratch("restore-after-failover");
  const std::string& dir = scratch.path;
  const std::string replicated = CtrConfig(dir, "replicated", kBackups, 300000);
  CheckpointEveryTenVersions(replicated);
  const std::string replica_zeros = absl::StrCat(dir, "/replicated-checkpoints/shard-0");
  const std::string backups = absl::StrCat(dir, "/replicated-checkpoints/replica-1/shard-0");

  Launch launch(replicated, "sync", absl::StrCat(dir, "/replicated.log"));
  const std::string address = launch.AwaitInLog(R"(info ps:0 serving (\S+))", absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launch.Output();
  int primary = 0;
  int backup = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(launch.AwaitInLog(R"(ps:0 \(pid (\d+)\))", absl::Seconds(60)), &primary))
      << launch.Output();
  ASSERT_TRUE(
      absl::SimpleAtoi(launch.AwaitInLog(R"(ps:0:1 \(pid (\d+)\))", absl::Seconds(60)), &backup))
      << launch.Output();
  ASSERT_GE(AwaitVersion(address, 20, absl::Seconds(120)), 20) << launch.Output();
  ASSERT_TRUE(AwaitBackupsInChain(address, absl::Seconds(120))) << launch.Output();
  ASSERT_EQ(kill(primary, SIGKILL), 0);
  int restarted = 0;
  ASSERT_TRUE(absl::SimpleAtoi(
      launch.AwaitInLog(R"(task ps:0 restarted \(pid (\d+)\))", absl::Seconds(60)), &restarted))
      << launch.Output();
  // The backup, primary now, checkpoints 30 versions past replica 0's last.
  const int64_t replica_zeros_last = NewestFileVersion(replica_zeros);
  ASSERT_TRUE(Eventually([&] { return NewestFileVersion(backups) >= replica_zeros_last + 30; },
                         absl::Seconds(120)))
      << launch.Output();
  const int64_t backups_checkpoint = NewestFileVersion(backups);
  EXPECT_EQ(kill(backup, SIGKILL), 0);
  EXPECT_EQ(kill(restarted, SIGKILL), 0);
  ASSERT_EQ(launch.Wait(absl::Seconds(400)), 0) << launch.Output();

  const std::string output = launch.Output();
  EXPECT_THAT(output, HasSubstr("task ps:0:1 exited with code 137"));
  // The last restore, once every replica was gone.
  const std::regex restored_at(R"(ps:0 restored its checkpoint at version (\d+))");
  int64_t restored = -1;
  for (auto match = std::sregex_iterator(output.begin(), output.end(), restored_at);
       match != std::sregex_iterator(); ++match) {
    ASSERT_TRUE(absl::SimpleAtoi((*match)[1].str(), &restored));
  }
  EXPECT_GE(restored, backups_checkpoint) << output;
  EXPECT_THAT(output, HasSubstr("a backup's folder"));
  const ShardCheckpoint final_state = Newest(replica_zeros);
  EXPECT_TRUE(final_state.finished());
  ExpectFinalOrBehind(backups, final_state);
}

// For comparison, the same job without backups: shard 0 killed mid-run
// and restarted from its checkpoint. The workers run their step again, and
// shard 1, which took the failed exchange's push already, answers the
// repeat at the version it made: no worker waits out its patience for a
// version that would never come (it did, for 120 s, and was restarted).
// Nor does a worker whose exchange left as shard 0 died wait unseen at the
// restarted one (gRPC's transparent retry sent it there, rpc/grpc_credentials.h).
TEST(ReplicationTest, AShardWithoutBackupsRestartedMidRunStallsNoWorker) {
  const ScratchFolder scratch("restore-plain");
  const std::string& dir = scratch.path;
  const std::string plain = CtrConfig(dir, "plain", "");
  std::string text = ReadFile(plain);
  ASSERT_EQ(absl::StrReplaceAll({{"-checkpoints\" }", "-checkpoints\" every_steps: 10 }"}}, &text),
            1);
  std::ofstream(plain) << text;
  const absl::Time start = absl::Now();
  const std::string output =
      RunKillingShardZerosPrimary(plain, "sync", absl::StrCat(dir, "/plain.log"), 45);
  EXPECT_THAT(output, HasSubstr("task ps:0 exited with code 137"));
  EXPECT_THAT(output, HasSubstr("reconnected; shard 0 is at version 40"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("did not arrive in time"))) << output;
  EXPECT_THAT(output, ::testing::Not(HasSubstr("task worker"))) << output;  // none restarted
  EXPECT_LT(absl::Now() - start, absl::Seconds(60)) << output;
}

TEST(ReplicationTest, AsyncAppliesEveryPushExactlyOnceAcrossAFailover) {
  const ScratchFolder scratch("failover-async");
  const std::string& dir = scratch.path;
  const std::string replicated = CtrConfig(dir, "replicated", kBackups, 90000);
  const std::string output =
      RunKillingShardZerosPrimary(replicated, "async", absl::StrCat(dir, "/replicated.log"), 60);
  EXPECT_THAT(output, HasSubstr("task ps:0 exited with code 137"));
  // Every push of every worker carries the dense gradients, so each one
  // applied moves the version by one: the final version counts the pushes
  // each shard applied, and the workers' steps the pushes they made.
  const std::string steps = JsonField(output.substr(output.rfind("{\"mode\"")), "steps");
  int64_t steps_made = 0;  // the summary counts every worker's steps
  ASSERT_TRUE(absl::SimpleAtoi(steps, &steps_made)) << output;
  // Each shard's final state, from whichever replica ended the run as
  // primary (as psctl export takes it).
  absl::StatusOr<std::vector<ShardCheckpoint>> final_states =
      ReadShardCheckpoints(absl::StrCat(dir, "/replicated-checkpoints"));
  ASSERT_TRUE(final_states.ok()) << final_states.status();
  ASSERT_EQ(final_states->size(), 2u);
  for (const ShardCheckpoint& final_state : *final_states) {
    SCOPED_TRACE(absl::StrCat("shard ", final_state.shard()));
    EXPECT_TRUE(final_state.finished());
    EXPECT_EQ(final_state.version(), steps_made);
  }
}

TEST(ReplicationTest, TrainingGoesOnWhileEtcdIsDownAndEndsAsWithoutTheOutage) {
  absl::StatusOr<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  const ScratchFolder scratch("etcd-down");
  const std::string& dir = scratch.path;
  // Long enough for the outage: about 780 steps, some 15 s on 2 cores.
  const std::string plain = CtrConfig(dir, "plain", "", 400000);
  const std::string replicated =
      CtrConfig(dir, "replicated",
                absl::StrCat(kBackups, "  membership { etcd_endpoints: \"", (*etcd)->endpoint(),
                             "\" lease_seconds: 1 }\n"),
                400000);
  const CommandResult without =
      RunCommand(absl::StrCat(Bin("pslaunch"), " --config=", plain, " --mode=sync"), 500);
  ASSERT_EQ(without.exit_code, 0) << without.err;

  Launch launch(replicated, "sync", absl::StrCat(dir, "/replicated.log"));
  const std::string address = launch.AwaitInLog(R"(info ps:0 serving (\S+))", absl::Seconds(60));
  ASSERT_FALSE(address.empty()) << launch.Output();
  ASSERT_GE(AwaitVersion(address, 30, absl::Seconds(120)), 30) << launch.Output();
  (*etcd)->Kill();
  // The primaries' leases lapse, and they serve on.
  ASSERT_FALSE(
      launch.AwaitInLog(R"((cannot renew the lease of the office))", absl::Seconds(30)).empty())
      << launch.Output();
  const int64_t lapsed_at = VersionAt(address);
  ASSERT_GE(lapsed_at, 30) << launch.Output();
  EXPECT_GE(AwaitVersion(address, lapsed_at + 20, absl::Seconds(30)), lapsed_at + 20)
      << "training stopped while etcd was down\n"
      << launch.Output();
  ASSERT_TRUE((*etcd)->Restart().ok());
  EXPECT_FALSE(launch.AwaitInLog(R"((etcd answers again))", absl::Seconds(30)).empty())
      << launch.Output();
  ASSERT_EQ(launch.Wait(absl::Seconds(400)), 0) << launch.Output();
  EXPECT_EQ(SummaryIn(launch.Output()), Summary(without)) << launch.Output();
}

}  // namespace PST_FILE_ID
}  // namespace pst
