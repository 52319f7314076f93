// Checkpoint files and shard restore: nothing torn or corrupted is ever
// loaded, and a restored shard continues exactly where the old one stood.
#include "ps_server/checkpoint.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/parameter_shard.h"

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
  ASSERT_TRUE(shard->Push(push, &response).ok());
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
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(pushed) << "a push went through before the checkpoint was written";
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

TEST(CheckpointTest, MissingDirectoryHasNothingToRestore) {
  std::vector<std::string> rejected;
  EXPECT_EQ(ReadNewestValidCheckpoint("/nonexistent/ckpt", &rejected).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pst
