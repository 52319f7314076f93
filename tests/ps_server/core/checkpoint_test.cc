// Checkpoint files and shard restore: nothing torn or corrupted is ever
// loaded, and a restored shard continues exactly where the old one stood.
// (The Checkpointer that writes and chooses them: checkpointer_test.cc.)
#include "ps_server/core/checkpoint.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "tests/ps_server/core/checkpoint_testing.h"
#include "tests/support/eventually.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;
using namespace checkpoint_testing;  // NOLINT(build/namespaces)

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
// Stats says how long the last capture held the shard's lock, the longest an
// update waited on it: nothing before the first. (A million floats and their
// momentum take far more than the microsecond the figure counts in.)
TEST(CheckpointTest, StatsSayHowLongTheLastCaptureHeldTheShard) {
  auto shard = MomentumShard();
  InitRequest init;
  EncodeTensor("w", std::vector<int64_t>{1 << 20}, std::vector<float>(1 << 20, 1.0f),
               init.add_variables());
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  StatsResponse before;
  shard->Stats(&before);
  EXPECT_EQ(before.checkpoint().capture_micros(), 0);
  const ShardCheckpoint taken = shard->CheckpointSnapshot();
  EXPECT_EQ(taken.variables(0).values().size(), (1u << 20) * sizeof(float));
  StatsResponse after;
  shard->Stats(&after);
  EXPECT_GT(after.checkpoint().capture_micros(), 0);
}

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

// A shard's state as a checkpoint file holds it, forged: two tables with
// rows, optimizer state, row counts and removed ids, and a dense variable.
ShardCheckpoint ForgedWithRows() {
  ShardCheckpoint checkpoint;
  checkpoint.set_version(7);
  checkpoint.set_run_id("run");
  ShardCheckpoint::Variable* w = checkpoint.add_variables();
  w->set_name("w");
  w->add_shape(3);
  w->set_values(std::string(12, '\1'));
  uint32_t state = 1;
  auto bytes = [&](size_t n) {
    std::string out(n, '\0');
    for (char& c : out) c = static_cast<char>((state = state * 1664525u + 1013904223u) >> 24);
    return out;
  };
  for (const auto& [rows, dim, removed] : {std::tuple{1000, 4, 0}, std::tuple{10, 2, 300}}) {
    ShardCheckpoint::Embedding* table = checkpoint.add_embeddings();
    table->mutable_config()->set_name(absl::StrCat("table", dim));
    table->mutable_config()->set_dim(dim);
    table->set_rows_admitted(rows);
    table->set_ids(bytes(8 * rows));
    table->set_values(bytes(4 * dim * rows));
    table->set_slots(bytes(4 * dim * rows));
    table->set_row_updates(bytes(8 * rows));
    table->set_removed_ids(bytes(8 * removed));
  }
  return checkpoint;
}

// The serialized pieces ForEachCheckpointPiece hands out.
std::vector<std::string> Pieces(const ShardCheckpoint& checkpoint, size_t max_piece_bytes) {
  std::vector<std::string> pieces;
  EXPECT_TRUE(
      ForEachCheckpointPiece(checkpoint, max_piece_bytes, [&](const ShardCheckpoint& piece) {
        pieces.push_back(piece.SerializeAsString());
        return absl::OkStatus();
      }).ok());
  return pieces;
}

// protobuf parses no message of 2 GiB or more, so a shard's rows are
// written as runs in pieces of their own and put back together in order.
TEST(CheckpointTest, RowsWrittenInPiecesReadBackAsTheyWere) {
  const ShardCheckpoint forged = ForgedWithRows();
  const std::string dir = FreshDir("ckpt_pieces");
  for (size_t max_piece_bytes : {size_t{1}, size_t{1000}, size_t{7777}, kCheckpointPieceBytes}) {
    SCOPED_TRACE(max_piece_bytes);
    const std::vector<std::string> pieces = Pieces(forged, max_piece_bytes);
    // The state but its rows, then the rows: at least one row a piece.
    if (max_piece_bytes == 1) {
      EXPECT_EQ(pieces.size(), 1 + 1000 + 10 + 300);  // a row or an id each
    } else if (max_piece_bytes == kCheckpointPieceBytes) {
      EXPECT_EQ(pieces.size(), 2u);
    } else {
      EXPECT_GT(pieces.size(), 3u);
      // Rows up to the bound, and a few bytes of framing per field.
      for (size_t i = 1; i < pieces.size(); ++i) {
        EXPECT_LE(pieces[i].size(), max_piece_bytes + 64) << "piece " << i;
      }
    }
    absl::StatusOr<std::string> path = WriteCheckpoint(dir, forged, 1, max_piece_bytes);
    ASSERT_TRUE(path.ok()) << path.status();
    absl::StatusOr<ShardCheckpoint> read = ReadCheckpoint(*path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->SerializeAsString(), forged.SerializeAsString());
  }
}

TEST(CheckpointTest, AFileCutAtAPieceBoundaryIsTornAndAForgedLengthAllocatesNothing) {
  const ShardCheckpoint forged = ForgedWithRows();
  const std::string dir = FreshDir("ckpt_piece_cut");
  absl::StatusOr<std::string> path = WriteCheckpoint(dir, forged, 1, 4096);
  ASSERT_TRUE(path.ok()) << path.status();
  const std::vector<std::string> pieces = Pieces(forged, 4096);
  ASSERT_GT(pieces.size(), 3u);
  std::filesystem::resize_file(*path,
                               std::filesystem::file_size(*path) - 12 - pieces.back().size());
  absl::StatusOr<ShardCheckpoint> read = ReadCheckpoint(*path);
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_THAT(read.status().message(),
              HasSubstr(absl::StrCat("is torn: piece ", pieces.size() - 1, " of ", pieces.size(),
                                     " is missing")));

  // One piece whose length claims 1 GiB, then 2^40 bytes, in a file of a
  // few bytes (sparse: 64 GiB long, no disk used, for the second).
  for (const auto& [claimed, file_bytes, expected] :
       {std::tuple{uint64_t{1} << 30, uint64_t{100}, "is torn: piece 0 of 1 has"},
        std::tuple{uint64_t{1} << 40, uint64_t{64} << 30, "more than a checkpoint holds"}}) {
    const std::string forged_file = dir + "/ckpt-000000000000999.bin";
    std::string header = "PSTCKPT2";
    for (uint64_t value : {uint64_t{1}, claimed}) {
      for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
    }
    header.append(4, '\0');  // the piece's checksum
    std::ofstream(forged_file, std::ios::binary | std::ios::trunc) << header;
    std::filesystem::resize_file(forged_file, file_bytes);
    read = ReadCheckpoint(forged_file);
    EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(expected));
  }
}

// A file's head is its first piece: the checkpoint without its rows, read
// even where a rows piece is cut off; a damaged first piece is refused.
TEST(CheckpointTest, TheHeadOfAFileIsItsFirstPieceAlone) {
  const ShardCheckpoint forged = ForgedWithRows();
  const std::string dir = FreshDir("ckpt_head");
  absl::StatusOr<std::string> path = WriteCheckpoint(dir, forged, 1, 4096);
  ASSERT_TRUE(path.ok()) << path.status();
  const std::vector<std::string> pieces = Pieces(forged, 4096);
  ASSERT_GT(pieces.size(), 2u);
  ShardCheckpoint expected;
  ASSERT_TRUE(expected.ParseFromString(pieces.front()));
  std::filesystem::resize_file(*path, std::filesystem::file_size(*path) - 1);
  absl::StatusOr<ShardCheckpoint> head = ReadCheckpointHead(*path);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->SerializeAsString(), expected.SerializeAsString());
  EXPECT_EQ(head->version(), forged.version());
  EXPECT_TRUE(absl::IsDataLoss(ReadCheckpoint(*path).status()));

  std::filesystem::resize_file(*path, 8 + 8 + 12 + pieces.front().size() - 1);
  EXPECT_TRUE(absl::IsDataLoss(ReadCheckpointHead(*path).status()));
}

// Checkpoints written before pieces: one payload after "PSTCKPT1".
TEST(CheckpointTest, ACheckpointOfTheFormerFormStillReads) {
  const ShardCheckpoint forged = ForgedWithRows();
  const std::string payload = forged.SerializeAsString();
  std::string file = "PSTCKPT1";
  const uint64_t length = payload.size();
  for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  const uint32_t crc = PayloadCrc32(payload);
  for (int i = 0; i < 4; ++i) file.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
  file += payload;
  const std::string dir = FreshDir("ckpt_former");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/ckpt-000000000000007.bin";
  std::ofstream(path, std::ios::binary) << file;
  absl::StatusOr<ShardCheckpoint> read = ReadCheckpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), payload);
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

}  // namespace PST_FILE_ID
}  // namespace pst
