#include "ps_server/service/replica_pieces.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pst {

absl::StatusOr<std::vector<ReplicaUpdate>> SplitReplicaUpdate(const ReplicaUpdate& update,
                                                              int64_t max_piece_bytes) {
  const auto total = static_cast<int64_t>(update.ByteSizeLong());
  if (total > kMaxReplicaUpdateBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the update is ", total,
                                                   " bytes, more than the ", kMaxReplicaUpdateBytes,
                                                   " a backup can parse"));
  }
  const std::string bytes = update.SerializeAsString();
  const int64_t step = std::max<int64_t>(1, max_piece_bytes);
  std::vector<ReplicaUpdate> pieces;
  for (int64_t offset = 0; offset < total; offset += step) {
    ReplicaUpdate& piece = pieces.emplace_back();
    piece.set_epoch(update.epoch());
    ReplicaPiece* part = piece.mutable_piece();
    part->set_offset(offset);
    part->set_total(total);
    part->set_bytes(bytes.substr(offset, step));
  }
  return pieces;
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
