// A primary's update too large for one message to its backup (a shard's
// state whole, or a version of a large dense model) travels in pieces: the
// sender serializes the ReplicaUpdate and cuts the bytes into messages of
// their own (ReplicaUpdate.piece), sent in order; the backup puts them
// back together and applies the update once its last piece is in. So a
// backup catches up with a state of any size, whatever the servers'
// message limit (--max_message_bytes).
//
// The bytes are parts, each its length (uint64, little-endian) and a
// serialized message: the update with its state but the state's embedding
// rows, then runs of those rows as checkpoint pieces
// (ps_server/core/checkpoint.h: ForEachCheckpointPiece), each no larger
// than a message piece or a checkpoint's. protobuf parses no message of
// 2 GiB or more; a shard's rows may be far more.
#ifndef PST_PS_SERVER_SERVICE_REPLICA_PIECES_H_
#define PST_PS_SERVER_SERVICE_REPLICA_PIECES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ps.pb.h"

namespace pst {

// The most bytes of an update in parts a backup takes (1 TiB): a bound on
// what a claim of a total may make it expect, far past a shard's state.
inline constexpr int64_t kMaxReplicaUpdateBytes = int64_t{1} << 40;

// An update, serialized once, and its pieces made one at a time: a sender
// holds the serialized bytes and the piece it sends, not every piece at
// once (a state whole may be most of 2 GiB).
class ReplicaPieces {
 public:
  // `update` in pieces of at most `max_piece_bytes` bytes each (at least
  // 1). InvalidArgument for an update whose parts come to more than
  // kMaxReplicaUpdateBytes, or whose state but its rows is 2 GiB or more.
  static absl::StatusOr<ReplicaPieces> Of(const ReplicaUpdate& update, int64_t max_piece_bytes);
  size_t size() const;
  // Piece `i` (< size()): the update's epoch and its bytes' i-th part.
  ReplicaUpdate Piece(size_t i) const;

 private:
  ReplicaPieces(std::string bytes, int64_t step, int64_t epoch)
      : bytes_(std::move(bytes)), step_(step), epoch_(epoch) {}
  std::string bytes_;
  int64_t step_;
  int64_t epoch_;
};

// Every piece of ReplicaPieces::Of(update, max_piece_bytes), at once.
absl::StatusOr<std::vector<ReplicaUpdate>> SplitReplicaUpdate(const ReplicaUpdate& update,
                                                              int64_t max_piece_bytes);

// A backup's side: one update being put back together at a time.
class ReplicaAssembly {
 public:
  // Takes the next piece: nullopt while more are to come, the update once
  // the last is in. A piece at offset 0 starts an update over (a sender
  // that was cut off sends it again from there). InvalidArgument, and the
  // pieces so far dropped, for a piece that does not follow them (another
  // offset or total), a total of 0 or past kMaxReplicaUpdateBytes, an
  // empty piece or one past the total, or bytes that are not an update
  // without pieces in parts. Memory grows with the bytes that arrive, never
  // with what a piece claims: each part is parsed once it is whole, so the
  // update's state is held once and beside it one part at most.
  absl::StatusOr<std::optional<ReplicaUpdate>> Take(const ReplicaUpdate& piece);
  // Bytes held of the update under way that no whole part has taken yet.
  int64_t held_bytes() const { return static_cast<int64_t>(bytes_.size()); }

 private:
  void Drop();
  // Parses the whole parts at the front of bytes_ into update_ and lets
  // their bytes go; false for a part that is no part of an update.
  bool ParseWholeParts();

  std::string bytes_;
  std::optional<ReplicaUpdate> update_;  // its parts parsed so far
  int64_t taken_ = 0;                    // bytes taken of the update under way
  int64_t total_ = 0;
};

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_REPLICA_PIECES_H_
