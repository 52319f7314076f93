// The Checkpointer: a PS never silently starts over or takes another run's
// (or another model's) state, and a failing disk stops the PS rather than
// letting the loss bound grow.
#include "ps_server/core/checkpointer.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/checkpoint.h"
#include "ps_server/core/model_share.h"
#include "ps_server/core/parameter_shard.h"
#include "tests/ps_server/core/checkpoint_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace checkpoint_testing;  // NOLINT(build/namespaces)

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.set_dir(FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  }
  std::string ShardDir() const { return config_.dir() + "/shard-0"; }

  // A shard of the job with one pushed update, checkpointed as `identity`.
  void WriteRun(const RunIdentity& identity, bool finished) {
    auto shard = MomentumShard();
    Init(shard.get());
    PushOnes(shard.get());
    if (finished) {
      DoneRequest done;
      DoneResponse response;
      ASSERT_TRUE(shard->Done(done, &response).ok());
    }
    Checkpointer checkpointer(shard.get(), config_, 0, identity);
    ASSERT_TRUE(checkpointer.CheckpointNow().ok());
  }

  CheckpointConfig config_;
};

// Every checkpoint file damaged: the PS refuses to start rather than train
// again from the initial weights; told to start fresh, it moves them aside.
TEST_F(CheckpointerTest, RefusesToStartWhenNoCheckpointRestores) {
  WriteRun({"", "job"}, /*finished=*/false);
  const std::string file = ListCheckpoints(ShardDir()).front();
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  auto shard = MomentumShard();
  Checkpointer checkpointer(shard.get(), config_, 0, {"", "job"});
  absl::StatusOr<int64_t> start = checkpointer.Prepare(CheckpointStart::kAuto);
  ASSERT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(start.status().message()), HasSubstr(ShardDir() + " holds 1 checkpoint"));
  EXPECT_THAT(std::string(start.status().message()), HasSubstr("--checkpoint_start=fresh"));

  Checkpointer fresh(shard.get(), config_, 0, {"", "job"});
  EXPECT_EQ(*fresh.Prepare(CheckpointStart::kFresh), -1);
  EXPECT_TRUE(ListCheckpoints(ShardDir()).empty());
  EXPECT_EQ(ListCheckpoints(ShardDir() + "/previous").size(), 1u);
}

// A second PS given a live PS's folder (another job's config, or the
// shard started twice): started fresh it would move the live PS's
// checkpoints aside, and both would write and prune the same files. It is
// refused, and the live PS's checkpoints stay where they are.
TEST_F(CheckpointerTest, RefusesAFolderALivePsHolds) {
  auto live = MomentumShard();
  Checkpointer holder(live.get(), config_, 0, {"run-a", "job"});
  ASSERT_EQ(*holder.Prepare(CheckpointStart::kAuto), -1);
  Init(live.get());
  PushOnes(live.get());
  ASSERT_TRUE(holder.CheckpointNow().ok());

  {
    auto other = MomentumShard();
    Checkpointer intruder(other.get(), config_, 0, {"run-b", "job"});
    absl::StatusOr<int64_t> start = intruder.Prepare(CheckpointStart::kFresh);
    EXPECT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(start.status().message()),
                HasSubstr(ShardDir() + " is in use by another live process"));
    EXPECT_EQ(intruder.PrepareBackup().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(ListCheckpoints(ShardDir()).size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(ShardDir() + "/previous"));
  PushOnes(live.get());
  EXPECT_TRUE(holder.CheckpointNow().ok()) << "the live PS writes on";
}

// Second hostile pass: a checkpoint folder another user made beforehand
// was trusted (their forged checkpoint restored NaN into the model; a
// link sent the PS's writes and deletions into another folder). The
// shard's folder must be this user's, not a link, and not writable by all.
TEST_F(CheckpointerTest, RefusesAFolderThatIsNotThisUsersAlone) {
  auto shard = MomentumShard();
  const std::string elsewhere = FreshDir("ckpt_elsewhere");
  std::filesystem::remove_all(ShardDir());
  std::filesystem::create_directories(std::filesystem::path(ShardDir()).parent_path());
  std::filesystem::create_directory_symlink(elsewhere, ShardDir());
  {
    Checkpointer checkpointer(shard.get(), config_, 0, {"", "job"});
    absl::StatusOr<int64_t> start = checkpointer.Prepare(CheckpointStart::kAuto);
    EXPECT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(start.status().message()), HasSubstr("is a symbolic link"));
  }
  std::filesystem::remove(ShardDir());
  std::filesystem::create_directories(ShardDir());
  std::filesystem::permissions(ShardDir(), std::filesystem::perms::all);
  {
    Checkpointer checkpointer(shard.get(), config_, 0, {"", "job"});
    absl::StatusOr<int64_t> start = checkpointer.Prepare(CheckpointStart::kAuto);
    EXPECT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(start.status().message()), HasSubstr("can be written by any user"));
  }
  std::filesystem::permissions(ShardDir(), std::filesystem::perms::owner_all |
                                               std::filesystem::perms::group_read |
                                               std::filesystem::perms::group_exec);
  if (geteuid() == 0) {  // only root can give a folder to another user
    ASSERT_EQ(chown(ShardDir().c_str(), 65534, 65534), 0);
    Checkpointer checkpointer(shard.get(), config_, 0, {"", "job"});
    absl::StatusOr<int64_t> start = checkpointer.Prepare(CheckpointStart::kAuto);
    EXPECT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(start.status().message()), HasSubstr("belongs to uid 65534"));
    ASSERT_EQ(chown(ShardDir().c_str(), 0, 0), 0);
  }
  Checkpointer checkpointer(shard.get(), config_, 0, {"", "job"});
  EXPECT_EQ(*checkpointer.Prepare(CheckpointStart::kAuto), -1) << "its own folder is used";
}

// A checkpoint of another run, another job or a finished run is not taken
// for this run's own; only --checkpoint_start=restore loads it, and then
// stamps it as this run's, so that this run's next restart finds it.
TEST_F(CheckpointerTest, RestoresOnlyItsOwnUnfinishedRunUnlessAsked) {
  struct Case {
    std::string name;
    RunIdentity written, starting;
    bool finished;
    std::string refusal;
  };
  const std::vector<Case> cases = {
      {"another run", {"run-a", "job"}, {"run-b", "job"}, false,
       "another run (version 1, run run-a; this is run run-b)"},
      {"another job", {"", "job-1"}, {"", "job-2"}, false, "another job"},
      {"a finished run", {"", "job"}, {"", "job"}, true, "final checkpoint of a finished run"},
      {"this run", {"run-a", "job"}, {"run-a", "job"}, false, ""},
      {"this run, finished", {"run-a", "job"}, {"run-a", "job"}, true, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::filesystem::remove_all(config_.dir());
    WriteRun(c.written, c.finished);
    auto shard = MomentumShard();
    Checkpointer automatic(shard.get(), config_, 0, c.starting);
    absl::StatusOr<int64_t> start = automatic.Prepare(CheckpointStart::kAuto);
    if (c.refusal.empty()) {
      EXPECT_EQ(*start, 1);
      continue;
    }
    ASSERT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(start.status().message()), HasSubstr(c.refusal));
    EXPECT_EQ(shard->version(), 0);

    {
      Checkpointer resume(shard.get(), config_, 0, c.starting);
      EXPECT_EQ(*resume.Prepare(CheckpointStart::kRestore), 1);
    }  // that PS ends; the next restarts
    absl::StatusOr<ShardCheckpoint> stamped = ReadCheckpoint(ListCheckpoints(ShardDir()).front());
    ASSERT_TRUE(stamped.ok());
    EXPECT_EQ(stamped->run_id(), c.starting.run_id);
    EXPECT_EQ(stamped->config_hash(), c.starting.config_hash);
    EXPECT_FALSE(stamped->finished());
    auto restarted = MomentumShard();
    Checkpointer again(restarted.get(), config_, 0, c.starting);
    EXPECT_EQ(*again.Prepare(CheckpointStart::kAuto), 1);
  }
}

// A replicated shard whose backup took the office checkpointed on in the
// backup's folder; every replica lost, replica 0 restarts: it restores that
// later state, not its own older one (which would lose the versions
// between), and writes it to its own folder. A backup folder of another
// run, or one any user can write to, is left alone.
TEST_F(CheckpointerTest, ReplicaZeroRestoresTheLaterStateItsBackupCheckpointed) {
  const RunIdentity run = {"run-a", "job"};
  const auto write_backup = [&](int replica, const RunIdentity& identity, int pushes) {
    auto shard = MomentumShard();
    Init(shard.get());
    for (int i = 0; i < pushes; ++i) PushOnes(shard.get());
    CheckpointConfig backup = config_;
    backup.set_dir(absl::StrCat(config_.dir(), "/replica-", replica));
    Checkpointer checkpointer(shard.get(), backup, 0, identity);
    ASSERT_TRUE(checkpointer.CheckpointNow().ok());
  };
  WriteRun(run, /*finished=*/false);  // version 1
  write_backup(1, run, 3);
  write_backup(2, {"run-b", "job"}, 5);  // a replica of an earlier run's
  write_backup(3, run, 4);
  std::filesystem::permissions(config_.dir() + "/replica-3/shard-0", std::filesystem::perms::all);
  {
    auto shard = MomentumShard();
    Checkpointer checkpointer(shard.get(), config_, 0, run);
    EXPECT_EQ(*checkpointer.Prepare(CheckpointStart::kAuto), 3);
    EXPECT_EQ(shard->version(), 3);
  }
  std::filesystem::remove_all(config_.dir() + "/replica-1");
  {
    auto shard = MomentumShard();
    Checkpointer checkpointer(shard.get(), config_, 0, run);
    EXPECT_EQ(*checkpointer.Prepare(CheckpointStart::kAuto), 3) << "its own folder holds it now";
  }
  // Its own folder empty: a backup's checkpoint of this run is this run's.
  write_backup(1, run, 3);
  std::filesystem::remove_all(ShardDir());
  {
    auto shard = MomentumShard();
    Checkpointer checkpointer(shard.get(), config_, 0, run);
    EXPECT_EQ(*checkpointer.Prepare(CheckpointStart::kAuto), 3);
  }
  std::filesystem::remove_all(ShardDir());
  {
    auto shard = MomentumShard();
    Checkpointer checkpointer(shard.get(), config_, 0, {"run-c", "job"});
    EXPECT_EQ(*checkpointer.Prepare(CheckpointStart::kAuto), -1) << "another run starts fresh";
  }
}

// Replica 0, primary at epoch 1, checkpointed a version its backup never
// held and died; the backup took over at epoch 2, made that version again
// and checkpointed it. Every replica lost, replica 0 restores the backup's
// of that version, the run's, not its own.
TEST_F(CheckpointerTest, ReplicaZeroRestoresTheLaterEpochsOfOneVersion) {
  const RunIdentity run = {"run-a", "job"};
  const auto write = [&](const std::string& dir, int pushes, int64_t epoch) {
    auto shard = MomentumShard();
    Init(shard.get());
    for (int i = 0; i < pushes; ++i) PushOnes(shard.get());
    ShardCheckpoint checkpoint = shard->CheckpointSnapshot();
    checkpoint.set_version(1);
    checkpoint.set_epoch(epoch);
    checkpoint.set_run_id(run.run_id);
    checkpoint.set_config_hash(run.config_hash);
    EXPECT_TRUE(WriteCheckpoint(dir, checkpoint, 3).ok());
    return checkpoint;
  };
  write(ShardDir(), /*pushes=*/1, /*epoch=*/1);
  const ShardCheckpoint taken_over = write(config_.dir() + "/replica-1/shard-0", 2, 2);
  auto shard = MomentumShard();
  Checkpointer checkpointer(shard.get(), config_, 0, run);
  EXPECT_EQ(*checkpointer.Prepare(CheckpointStart::kAuto), 1);
  EXPECT_EQ(shard->CheckpointSnapshot().variables(0).values(), taken_over.variables(0).values());
}

// A backup restarted keeps what it checkpointed earlier in this run (as
// primary perhaps), for replica 0 to restore; another run's checkpoints, or
// those of a run without an id to tell it by, it moves aside.
TEST_F(CheckpointerTest, ABackupKeepsOnlyThisRunsCheckpoints) {
  CheckpointConfig backup = config_;
  backup.set_dir(config_.dir() + "/replica-1");
  const std::string folder = backup.dir() + "/shard-0";
  const struct {
    std::string name;
    RunIdentity written, starting;
    bool kept;
  } cases[] = {
      {"this run", {"run-a", "job"}, {"run-a", "job"}, true},
      {"another run", {"run-a", "job"}, {"run-b", "job"}, false},
      {"another job", {"run-a", "job-1"}, {"run-a", "job-2"}, false},
      {"no run id", {"", "job"}, {"", "job"}, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::filesystem::remove_all(backup.dir());
    {
      auto shard = MomentumShard();
      Init(shard.get());
      PushOnes(shard.get());
      Checkpointer checkpointer(shard.get(), backup, 0, c.written);
      ASSERT_TRUE(checkpointer.CheckpointNow().ok());
    }
    auto shard = MomentumShard();
    Checkpointer checkpointer(shard.get(), backup, 0, c.starting);
    ASSERT_TRUE(checkpointer.PrepareBackup().ok());
    EXPECT_EQ(shard->version(), 0) << "a backup restores nothing";
    EXPECT_EQ(ListCheckpoints(folder).size(), c.kept ? 1u : 0u);
    EXPECT_EQ(ListCheckpoints(folder + "/previous").size(), c.kept ? 0u : 1u);
  }
}

// Third hostile pass: --checkpoint_start=restore restored tables of another
// shape or name with only the generic warning. Where the config names the
// model, a checkpoint of another model is refused unless asked for by name.
TEST_F(CheckpointerTest, RestoresAnotherModelOnlyWhenAskedForByName) {
  WriteRun({"run-a", "job"}, /*finished=*/false);  // "w" [3]
  const auto shard_of = [](std::vector<int64_t> shape) {
    ShardOptions options;
    options.mode = ASYNC;
    options.num_workers = 1;
    options.optimizer.mutable_sgd()->set_learning_rate(0.1f);
    options.optimizer.mutable_sgd()->set_momentum(0.9f);
    ConfigModel model;
    model.variables = {{"w", std::move(shape)}};
    options.model = std::move(model);
    return std::move(*ParameterShard::Create(options));
  };
  {
    auto other = shard_of({4});
    Checkpointer restore(other.get(), config_, 0, {"run-b", "job"});
    absl::StatusOr<int64_t> start = restore.Prepare(CheckpointStart::kRestore);
    ASSERT_EQ(start.status().code(), absl::StatusCode::kFailedPrecondition) << start.status();
    EXPECT_THAT(std::string(start.status().message()),
                HasSubstr("holds another model than the config's: variable 0 is"));
    EXPECT_THAT(std::string(start.status().message()),
                HasSubstr("--checkpoint_start=restore_other_model"));
    EXPECT_FALSE(other->initialized());
  }
  {
    auto other = shard_of({4});
    Checkpointer restore(other.get(), config_, 0, {"run-b", "job"});
    EXPECT_EQ(*restore.Prepare(CheckpointStart::kRestoreOtherModel), 1);
    EXPECT_TRUE(other->initialized());
  }
  std::filesystem::remove_all(config_.dir());
  WriteRun({"run-a", "job"}, /*finished=*/false);
  auto same = shard_of({3});
  Checkpointer restore(same.get(), config_, 0, {"run-b", "job"});
  EXPECT_EQ(*restore.Prepare(CheckpointStart::kRestore), 1);
}

// Pushes are applied on a thread of their own, as fast as the shard lets them.
class Pusher {
 public:
  explicit Pusher(ParameterShard* shard)
      : thread_([this, shard] {
          while (!stop_) {
            PushRequest push;
            push.set_computed_at_version(shard->version());
            std::vector<float> g = {1, 1, 1};
            EncodeTensor("w", std::vector<int64_t>{3}, g, push.add_gradients());
            PushResponse response;
            Push(*shard, push, &response).IgnoreError();  // Unavailable once shut down
          }
        }) {}
  ~Pusher() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A write that fails is retried while pushes stay held, so the model never
// runs ahead of the disk by more than every_steps; each failure is counted
// in Stats.
TEST_F(CheckpointerTest, FailedWritesAreRetriedWhilePushesWait) {
  config_.set_every_steps(2);
  config_.set_max_failures(5);
  auto shard = MomentumShard(0, /*snapshot_every_steps=*/2);
  std::mutex mu;
  std::vector<int64_t> versions_seen;  // the shard's version at each attempt
  absl::Notification written;
  Checkpointer checkpointer(
      shard.get(), config_, 0, {"", "job"},
      [&](const std::string& dir, const ShardCheckpoint& checkpoint,
          int keep) -> absl::StatusOr<std::string> {
        std::lock_guard<std::mutex> lock(mu);
        versions_seen.push_back(shard->version());
        if (versions_seen.size() < 3) return absl::UnavailableError("No space left on device");
        if (!written.HasBeenNotified()) written.Notify();
        return WriteCheckpoint(dir, checkpoint, keep);
      });
  Init(shard.get());
  checkpointer.Start();
  {
    Pusher pusher(shard.get());
    ASSERT_TRUE(written.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  checkpointer.Stop();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(versions_seen.size(), 3u);
  EXPECT_EQ(versions_seen[0], 2);
  EXPECT_EQ(versions_seen[1], 2) << "pushes went on while the checkpoint was unwritten";
  EXPECT_EQ(versions_seen[2], 2) << "pushes went on while the checkpoint was unwritten";
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.checkpoint().failures(), 2);
  EXPECT_EQ(stats.checkpoint().consecutive_failures(), 0);
  EXPECT_GE(stats.checkpoint().written(), 1);
  EXPECT_GE(stats.checkpoint().version(), 2);
}

// A disk that keeps failing stops the PS after max_failures attempts, and
// Stats says why until then.
TEST_F(CheckpointerTest, GivesUpAfterMaxFailuresInARow) {
  config_.set_every_steps(1);
  config_.set_max_failures(2);
  auto shard = MomentumShard(0, /*snapshot_every_steps=*/1);
  Checkpointer checkpointer(shard.get(), config_, 0, {"", "job"},
                            [](const std::string&, const ShardCheckpoint&, int) {
                              return absl::StatusOr<std::string>(
                                  absl::UnavailableError("No space left on device"));
                            });
  absl::Notification gave_up;
  std::string reason;
  checkpointer.set_on_give_up([&](const absl::Status& status) {
    reason = std::string(status.message());
    gave_up.Notify();
  });
  Init(shard.get());
  checkpointer.Start();
  PushOnes(shard.get());
  ASSERT_TRUE(gave_up.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_THAT(reason, HasSubstr("failed 2 times in a row (No space left on device)"));
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.checkpoint().failures(), 2);
  EXPECT_EQ(stats.checkpoint().consecutive_failures(), 2);
  EXPECT_EQ(stats.checkpoint().last_error(), "No space left on device");
  EXPECT_EQ(stats.checkpoint().version(), -1);
  EXPECT_EQ(shard->version(), 1);
  shard->BeginShutdown();
  checkpointer.Stop();
}

}  // namespace PST_FILE_ID
}  // namespace pst
