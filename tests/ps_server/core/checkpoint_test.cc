// Checkpoint files, shard restore and the Checkpointer: nothing torn or
// corrupted is ever loaded, a restored shard continues exactly where the old
// one stood, a PS never silently starts over or takes another run's state,
// and a failing disk stops the PS rather than letting the loss bound grow.
#include "ps_server/core/checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>

#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/synchronization/notification.h"
#include "ps_server/core/checkpointer.h"
#include "ps_server/core/model_share.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/support/eventually.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<ParameterShard> MomentumShard(int shard_index = 0, int snapshot_every_steps = 0) {
  ShardOptions options;
  options.snapshot_every_steps = snapshot_every_steps;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.shard = shard_index;
  options.optimizer.mutable_sgd()->set_learning_rate(0.1f);
  options.optimizer.mutable_sgd()->set_momentum(0.9f);
  return std::move(*ParameterShard::Create(options));
}

void Init(ParameterShard* shard) {
  InitRequest init;
  std::vector<float> w = {1, 2, 3};
  EncodeTensor("w", std::vector<int64_t>{3}, w, init.add_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
}

void PushOnes(ParameterShard* shard) {
  PushRequest push;
  push.set_computed_at_version(shard->version());
  std::vector<float> g = {1, 1, 1};
  EncodeTensor("w", std::vector<int64_t>{3}, g, push.add_gradients());
  PushResponse response;
  ASSERT_TRUE(Push(*shard, push, &response).ok());
}

std::string FreshDir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/" + name + "." + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// With a checkpoint writer attached, no update lands while the snapshot
// scheduled at a multiple of every_steps is unwritten, so what is on disk is
// never more than every_steps versions behind the model.
TEST(CheckpointTest, PushesWaitForTheScheduledSnapshotToBeWritten) {
  auto shard = MomentumShard(0, /*snapshot_every_steps=*/2);
  shard->AttachCheckpointWriter();
  Init(shard.get());
  PushOnes(shard.get());
  PushOnes(shard.get());  // version 2: a snapshot is scheduled
  std::atomic<bool> pushed{false};
  std::thread pusher([&] {
    PushOnes(shard.get());
    pushed = true;
  });
  EXPECT_TRUE(Eventually([&] { return shard->waiting_updates() == 1 || pushed.load(); }));
  EXPECT_FALSE(pushed) << "a push went through before the checkpoint was written";
  EXPECT_EQ(shard->waiting_updates(), 1);
  EXPECT_EQ(shard->version(), 2);
  std::optional<ShardCheckpoint> snapshot = shard->TakeScheduledSnapshot(absl::Now());
  ASSERT_TRUE(snapshot.has_value());
  EXPECT_EQ(snapshot->version(), 2);
  shard->ScheduledSnapshotWritten();
  pusher.join();
  EXPECT_TRUE(pushed);
  EXPECT_EQ(shard->version(), 3);
  // Detached (the checkpointer stopped), nothing waits any more.
  PushOnes(shard.get());  // version 4 schedules a snapshot
  shard->DetachCheckpointWriter();
  PushOnes(shard.get());
  EXPECT_EQ(shard->version(), 5);
}

TEST(CheckpointTest, RestoredShardContinuesBitwiseLikeTheOriginal) {
  auto original = MomentumShard();
  Init(original.get());
  PushOnes(original.get());
  PushOnes(original.get());
  std::string dir = FreshDir("ckpt_roundtrip");
  absl::StatusOr<std::string> path = WriteCheckpoint(dir, original->Snapshot(), 3);
  ASSERT_TRUE(path.ok()) << path.status();

  auto restored = MomentumShard();
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dir, &rejected);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  ASSERT_TRUE(restored->Restore(*checkpoint).ok());
  EXPECT_EQ(restored->version(), 2);
  // The momentum state came along: one more identical push lands on identical values.
  PushOnes(original.get());
  PushOnes(restored.get());
  EXPECT_EQ(original->Snapshot().SerializeAsString(), restored->Snapshot().SerializeAsString());
  // An Init after a restore is ignored: first writer (the checkpoint) wins.
  InitRequest late;
  std::vector<float> other = {9, 9, 9};
  EncodeTensor("w", std::vector<int64_t>{3}, other, late.add_variables());
  InitResponse response;
  ASSERT_TRUE(restored->Init(late, &response).ok());
  EXPECT_FALSE(response.accepted());
}

// Plain SGD keeps no optimizer slots. Found by shard_fuzzer: restoring them
// passed a null pointer to memcpy, which UBSan reports (scripts/sanitize.sh).
TEST(CheckpointTest, PlainSgdShardWithoutSlotsRoundTrips) {
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.optimizer.mutable_sgd()->set_learning_rate(0.1f);
  auto original = std::move(*ParameterShard::Create(options));
  Init(original.get());
  PushOnes(original.get());
  const ShardCheckpoint snapshot = original->Snapshot();
  ASSERT_EQ(snapshot.variables(0).slots().size(), 0u);

  auto restored = std::move(*ParameterShard::Create(options));
  ASSERT_TRUE(restored->Restore(snapshot).ok());
  EXPECT_EQ(restored->Snapshot().SerializeAsString(), snapshot.SerializeAsString());
}

TEST(CheckpointTest, TornAndCorruptedFilesAreRejectedForTheNewestValidOne) {
  auto shard = MomentumShard();
  Init(shard.get());
  std::string dir = FreshDir("ckpt_fallback");
  ASSERT_TRUE(WriteCheckpoint(dir, shard->Snapshot(), 5).ok());  // version 0
  PushOnes(shard.get());
  ASSERT_TRUE(WriteCheckpoint(dir, shard->Snapshot(), 5).ok());  // version 1
  PushOnes(shard.get());
  absl::StatusOr<std::string> newest = WriteCheckpoint(dir, shard->Snapshot(), 5);  // version 2
  ASSERT_TRUE(newest.ok());
  std::vector<std::string> files = ListCheckpoints(dir);
  ASSERT_EQ(files.size(), 3u);

  // Tear the newest (as a crash mid-copy would) and flip a byte in the next.
  std::filesystem::resize_file(files[0], std::filesystem::file_size(files[0]) - 3);
  {
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7f');
  }
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dir, &rejected);
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_EQ(checkpoint->version(), 0);
  ASSERT_EQ(rejected.size(), 2u);
  EXPECT_THAT(rejected[0], HasSubstr("is torn"));
  EXPECT_THAT(rejected[1], HasSubstr("fails its checksum"));
}

// zlib takes a piece's length in 32 bits: the checksum is fed in pieces,
// and is the same whatever their size. (Files of 4 GiB or more are summed
// in kCrc32PieceBytes pieces, which the code asserts fit 32 bits; the
// pieces are exercised here on small buffers.)
TEST(CheckpointTest, ThePayloadChecksumIsTheSameWhateverItsPieces) {
  // The CRC-32 check value (ISO-HDLC) of "123456789".
  for (size_t piece : {size_t{0}, size_t{1}, size_t{2}, size_t{4}, size_t{8}, size_t{9},
                       size_t{100}, kCrc32PieceBytes}) {
    SCOPED_TRACE(piece);
    EXPECT_EQ(PayloadCrc32("123456789", piece), 0xCBF43926u);
  }
  std::string payload(100000, '\0');
  uint32_t state = 1;
  for (char& c : payload) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
  const uint32_t whole = PayloadCrc32(payload, payload.size());
  EXPECT_EQ(PayloadCrc32(payload), whole);
  for (size_t piece : {size_t{1}, size_t{3}, size_t{4096}, size_t{99999}}) {
    SCOPED_TRACE(piece);
    EXPECT_EQ(PayloadCrc32(payload, piece), whole);
  }
  payload[77777] ^= 1;
  EXPECT_NE(PayloadCrc32(payload, 4096), whole);
}

TEST(CheckpointTest, AFifoNamedLikeACheckpointIsRefusedWithoutWaiting) {
  auto shard = MomentumShard();
  Init(shard.get());
  const std::string dir = FreshDir("ckpt_fifo");
  ASSERT_TRUE(WriteCheckpoint(dir, shard->Snapshot(), 5).ok());  // version 0
  const std::string fifo = dir + "/ckpt-000000000000009.bin";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);

  absl::Notification read;
  absl::StatusOr<ShardCheckpoint> checkpoint;
  std::vector<std::string> rejected;
  std::thread reader([&] {
    checkpoint = ReadNewestValidCheckpoint(dir, &rejected);
    read.Notify();
  });
  if (!read.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    ADD_FAILURE() << "reading the checkpoint directory waits on the FIFO";
    // A writer lets a reader blocked in open() go, so the test can end.
    const int unblock = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (unblock >= 0) close(unblock);
  }
  reader.join();
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->version(), 0);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_THAT(rejected[0], HasSubstr("is not a regular file"));
}

// Second hostile pass: a sparse file of 200 GB named like the newest
// checkpoint made the PS allocate its size at every start (std::bad_alloc,
// abort). The header is read first; a claim past what a checkpoint holds,
// or bytes past the claimed payload, are refused before any allocation.
TEST(CheckpointTest, AHugeSparseFileNamedLikeACheckpointIsRefusedWithoutAllocatingIt) {
  auto shard = MomentumShard();
  Init(shard.get());
  const std::string dir = FreshDir("ckpt_sparse");
  ASSERT_TRUE(WriteCheckpoint(dir, shard->Snapshot(), 5).ok());  // version 0
  const std::string claims_too_much = dir + "/ckpt-000000000000998.bin";
  const std::string longer_than_claimed = dir + "/ckpt-000000000000999.bin";
  for (const auto& [path, claimed] : {std::pair{claims_too_much, uint64_t{1} << 40},
                                      std::pair{longer_than_claimed, uint64_t{16}}}) {
    std::string header = "PSTCKPT1";
    for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>((claimed >> (8 * i)) & 0xff));
    header.append(4, '\0');  // the checksum
    std::ofstream(path, std::ios::binary) << header;
    std::filesystem::resize_file(path, uint64_t{64} << 30);  // sparse: no disk used
  }
  std::vector<std::string> rejected;
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(dir, &rejected);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ(checkpoint->version(), 0);
  ASSERT_EQ(rejected.size(), 2u);
  EXPECT_THAT(rejected[0], HasSubstr("bytes past its payload"));
  EXPECT_THAT(rejected[1], HasSubstr("more than a checkpoint holds"));
}

// A checkpoint holding a non-finite value was not written by a PS (one is
// never written into the model): restoring it is refused.
TEST(CheckpointTest, RestoreRefusesANonFiniteValue) {
  auto shard = MomentumShard();
  Init(shard.get());
  ShardCheckpoint forged = shard->Snapshot();
  ASSERT_GT(forged.variables_size(), 0);
  std::string* values = forged.mutable_variables(0)->mutable_values();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(values->data(), &nan, sizeof(nan));
  auto restored = MomentumShard();
  const absl::Status status = restored->Restore(forged);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("non-finite"));
  EXPECT_EQ(restored->parameter_bytes(), 0) << "the shard took some of it";
}

TEST(CheckpointTest, KeepsOnlyTheNewestK) {
  auto shard = MomentumShard();
  Init(shard.get());
  std::string dir = FreshDir("ckpt_keep");
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(WriteCheckpoint(dir, shard->Snapshot(), 2).ok());
    PushOnes(shard.get());
  }
  std::vector<std::string> files = ListCheckpoints(dir);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_THAT(files[0], HasSubstr("ckpt-000000000000004.bin"));
  EXPECT_THAT(files[1], HasSubstr("ckpt-000000000000003.bin"));
}

TEST(CheckpointTest, OnlyItsOwnerCanReadACheckpoint) {
  auto shard = MomentumShard();
  Init(shard.get());
  std::string dir = FreshDir("ckpt_mode");
  absl::StatusOr<std::string> path = WriteCheckpoint(dir, shard->Snapshot(), 1);
  ASSERT_TRUE(path.ok()) << path.status();
  struct stat status;
  ASSERT_EQ(stat(path->c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u);
}

TEST(CheckpointTest, RestoreRefusesAnotherShardsCheckpointOrALiveShard) {
  auto shard = MomentumShard(0);
  Init(shard.get());
  ShardCheckpoint checkpoint = shard->Snapshot();
  auto other = MomentumShard(1);
  EXPECT_EQ(other->Restore(checkpoint).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Restore(checkpoint).code(), absl::StatusCode::kFailedPrecondition);
  ShardOptions adam;
  adam.optimizer.mutable_adam()->set_learning_rate(0.1f);
  auto adam_shard = std::move(*ParameterShard::Create(adam));
  absl::Status status = adam_shard->Restore(checkpoint);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("momentum"));
}

// A disk that fills up mid-write (here a file-size limit) leaves nothing
// behind: no torn temporary file accumulates on the full disk.
TEST(CheckpointTest, AFailedWriteLeavesNoTemporaryFile) {
  auto shard = MomentumShard();
  InitRequest init;
  std::vector<float> big(64 * 1024, 1.0f);
  EncodeTensor("w", std::vector<int64_t>{static_cast<int64_t>(big.size())}, big,
               init.add_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  const std::string dir = FreshDir("ckpt_full_disk");
  std::filesystem::create_directories(dir);
  rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::StatusOr<std::string> written = WriteCheckpoint(dir, shard->Snapshot(), 3);
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(std::string(written.status().message()), HasSubstr("cannot write"));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << std::filesystem::directory_iterator(dir)->path();
}

TEST(CheckpointTest, MissingDirectoryHasNothingToRestore) {
  std::vector<std::string> rejected;
  EXPECT_EQ(ReadNewestValidCheckpoint("/nonexistent/ckpt", &rejected).status().code(),
            absl::StatusCode::kNotFound);
}

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

    Checkpointer resume(shard.get(), config_, 0, c.starting);
    EXPECT_EQ(*resume.Prepare(CheckpointStart::kRestore), 1);
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

}  // namespace
}  // namespace pst
