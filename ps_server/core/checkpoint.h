// Checkpoint files of one PS shard.
//
// A file is "PSTCKPT2", its number of pieces (uint64, little-endian), then
// each piece: its length (uint64, little-endian), its CRC-32 (uint32,
// little-endian) and its bytes, a serialized ShardCheckpoint. The first
// piece is the checkpoint without its embedding tables' rows, each next one
// a run of rows (ForEachCheckpointPiece), appended in order on reading
// (MergeCheckpointPiece): protobuf parses no message past 2 GiB, so a
// shard's rows could not be one message, and a reader holds one piece
// beside what it has put together, not the file twice. Files of the former
// form ("PSTCKPT1", the payload's length, its CRC-32, one payload) still
// read. Files are written to a temporary name, fsync'd, renamed into place
// and the directory fsync'd, so a crash leaves either the old file set or
// the new one, never a torn file under a checkpoint's name; the checksums
// catch what the disk itself corrupts.
//
// Chains. A full checkpoint is ckpt-<version>.bin; a delta
// (ShardCheckpoint.delta: the embedding tables' rows changed since its
// parent, checkpoint_delta.h) is ckpt-<version>.delta-<parent>.bin, its
// parent being the full checkpoint or the delta at <parent>. A delta
// restores through its chain: the deltas back to the full checkpoint at
// its base_version, each file verified, applied oldest first. A version is
// one file: writing one removes any other file of its version (a link
// rewritten after a restore).
#ifndef PST_PS_SERVER_CORE_CHECKPOINT_H_
#define PST_PS_SERVER_CORE_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps.pb.h"

namespace pst {

// How many bytes of rows a piece holds at most (a row is never split).
inline constexpr size_t kCheckpointPieceBytes = size_t{64} << 20;

// Hands `checkpoint` to `write` in pieces, in order: first everything but
// the embedding tables' rows and removed ids, then runs of those of at most
// `max_piece_bytes` each (at least one row a piece), the runs of a table in
// its order. A table whose fields do not divide into rows goes whole into
// one piece. Stops at, and returns, the first error `write` returns.
absl::Status ForEachCheckpointPiece(const ShardCheckpoint& checkpoint, size_t max_piece_bytes,
                                    absl::FunctionRef<absl::Status(const ShardCheckpoint&)> write);

// Appends a later piece's rows and removed ids to `whole`'s tables, table
// i to table i. InvalidArgument where the piece has more tables than
// `whole` or holds anything but rows.
absl::Status MergeCheckpointPiece(ShardCheckpoint* whole, const ShardCheckpoint& piece);

// Writes `checkpoint` as <dir>/ckpt-<version>.bin (a delta:
// ckpt-<version>.delta-<parent>.bin), creating `dir` if needed, then
// deletes the other file of its version if any, and every file but the
// newest `keep` checkpoints, this one and the links their chains go back
// through. Returns the path. A failed write (Unavailable: disk full, I/O
// error) leaves no file behind.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir,
                                            const ShardCheckpoint& checkpoint, int keep,
                                            size_t max_piece_bytes = kCheckpointPieceBytes);

// Reads and verifies one file (a delta as it is: ReadNewestValidCheckpoint
// applies chains). DataLoss naming the file when it is torn, corrupted or
// not a regular file (a FIFO in its place is refused at once, never
// waited on).
absl::StatusOr<ShardCheckpoint> ReadCheckpoint(const std::string& path);

// A file's checkpoint without its embedding tables' rows (its version, run
// and config, dense variables), from its first piece alone: the rest of
// the file is neither read nor verified. A file of the former one-message
// form is read whole.
absl::StatusOr<ShardCheckpoint> ReadCheckpointHead(const std::string& path);

// The CRC-32 of a checkpoint's payload, fed to zlib in pieces of at most
// `max_piece_bytes` (at least 1): zlib counts a piece's length in 32 bits,
// so a payload of 4 GiB or more given whole would be summed wrongly. Files
// are written and checked with the default; the sum is the same whatever
// the pieces.
inline constexpr size_t kCrc32PieceBytes = size_t{1} << 30;
uint32_t PayloadCrc32(std::string_view payload, size_t max_piece_bytes = kCrc32PieceBytes);

// Deletes the temporary files a crash mid-write left in `dir`; returns how many.
int RemoveTemporaryFiles(const std::string& dir);

// Checkpoint files in `dir`, full and delta, newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);

// What a checkpoint file's name says: its version and, of a delta, its
// parent's. nullopt for a name not written by WriteCheckpoint.
struct CheckpointName {
  int64_t version = 0;
  bool delta = false;
  int64_t parent_version = -1;
};
std::optional<CheckpointName> ParseCheckpointName(std::string_view file_name);

// The newest checkpoint in `dir` that restores: a full one that
// verifies, or a delta whose whole chain does, applied (so never a
// delta). Each one skipped is reported in `rejected` with the reason (for
// a delta, the link of its chain that failed). NotFound when there is
// none.
absl::StatusOr<ShardCheckpoint> ReadNewestValidCheckpoint(const std::string& dir,
                                                          std::vector<std::string>* rejected);

}  // namespace pst

#endif  // PST_PS_SERVER_CORE_CHECKPOINT_H_
