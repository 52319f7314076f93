#include "ps_server/service/replica_pieces.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pst {

absl::StatusOr<ReplicaPieces> ReplicaPieces::Of(const ReplicaUpdate& update,
                                                int64_t max_piece_bytes) {
  const auto total = static_cast<int64_t>(update.ByteSizeLong());
  if (total > kMaxReplicaUpdateBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the update is ", total,
                                                   " bytes, more than the ", kMaxReplicaUpdateBytes,
                                                   " a backup can parse"));
  }
  std::string bytes(static_cast<size_t>(total), '\0');
  // The sizes ByteSizeLong cached: one walk of the update, not two.
  update.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes.data()));
  return ReplicaPieces(std::move(bytes), std::max<int64_t>(1, max_piece_bytes), update.epoch());
}

size_t ReplicaPieces::size() const {
  const auto total = static_cast<int64_t>(bytes_.size());
  return static_cast<size_t>((total + step_ - 1) / step_);
}

ReplicaUpdate ReplicaPieces::Piece(size_t i) const {
  const int64_t offset = static_cast<int64_t>(i) * step_;
  ReplicaUpdate piece;
  piece.set_epoch(epoch_);
  ReplicaPiece* part = piece.mutable_piece();
  part->set_offset(offset);
  part->set_total(static_cast<int64_t>(bytes_.size()));
  part->set_bytes(bytes_.substr(offset, step_));
  return piece;
}

absl::StatusOr<std::vector<ReplicaUpdate>> SplitReplicaUpdate(const ReplicaUpdate& update,
                                                              int64_t max_piece_bytes) {
  absl::StatusOr<ReplicaPieces> pieces = ReplicaPieces::Of(update, max_piece_bytes);
  if (!pieces.ok()) return pieces.status();
  std::vector<ReplicaUpdate> all;
  all.reserve(pieces->size());
  for (size_t i = 0; i < pieces->size(); ++i) all.push_back(pieces->Piece(i));
  return all;
}

void ReplicaAssembly::Drop() {
  std::string().swap(bytes_);
  total_ = 0;
}

absl::StatusOr<std::optional<ReplicaUpdate>> ReplicaAssembly::Take(const ReplicaUpdate& piece) {
  const ReplicaPiece& part = piece.piece();
  const auto size = static_cast<int64_t>(part.bytes().size());
  if (part.offset() == 0) Drop();
  const auto refuse = [&](const std::string& why) {
    Drop();
    return absl::InvalidArgumentError(absl::StrCat("an update's piece at offset ", part.offset(),
                                                   " of ", part.total(), " bytes: ", why));
  };
  if (part.total() <= 0 || part.total() > kMaxReplicaUpdateBytes) {
    return refuse(absl::StrCat("an update has 1 to ", kMaxReplicaUpdateBytes, " bytes"));
  }
  if (size == 0 || part.offset() < 0 || size > part.total() - part.offset()) {
    return refuse(absl::StrCat("a piece of ", size, " bytes does not lie within it"));
  }
  if (part.offset() != held_bytes() || (total_ != 0 && part.total() != total_)) {
    return refuse(absl::StrCat("it does not follow the ", held_bytes(), " bytes of ", total_,
                               " taken; the update is sent again from offset 0"));
  }
  total_ = part.total();
  bytes_.append(part.bytes());
  if (held_bytes() < total_) return std::nullopt;
  ReplicaUpdate update;
  const bool parsed = update.ParseFromString(bytes_);
  Drop();
  if (!parsed) return refuse("its bytes are not an update");
  if (update.has_piece()) return refuse("a piece's update has pieces itself");
  return update;
}

}  // namespace pst
