#include "ps_server/service/replica_pieces.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "common/proto_fields.h"
#include "ps_server/core/checkpoint.h"

namespace pst {

namespace {

constexpr size_t kLengthBytes = 8;
constexpr std::array<std::string_view, 1> kStateField = {"state"};

void AppendPart(const google::protobuf::MessageLite& part, std::string* bytes) {
  const size_t length = part.ByteSizeLong();
  AppendLittleEndian(length, static_cast<int>(kLengthBytes), bytes);
  const size_t at = bytes->size();
  bytes->resize(at + length);
  // The size ByteSizeLong cached: one walk of the part, not two.
  part.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes->data() + at));
}

}  // namespace

absl::StatusOr<ReplicaPieces> ReplicaPieces::Of(const ReplicaUpdate& update,
                                                int64_t max_piece_bytes) {
  max_piece_bytes = std::max<int64_t>(1, max_piece_bytes);
  const auto total = static_cast<int64_t>(update.ByteSizeLong());
  std::string bytes;
  // Room for every part with its framing, so that the string never grows
  // by copying.
  bytes.reserve(static_cast<size_t>(total + total / 1024 + 4096));
  const size_t rows_piece_bytes =
      std::min(kCheckpointPieceBytes, static_cast<size_t>(max_piece_bytes));
  absl::Status parts = ForEachCheckpointPiece(
      update.state(), rows_piece_bytes, [&](const ShardCheckpoint& piece) -> absl::Status {
        if (!bytes.empty()) {
          AppendPart(piece, &bytes);
          return absl::OkStatus();
        }
        ReplicaUpdate head;
        CopyAllFieldsBut(update, kStateField, &head);
        *head.mutable_state() = piece;
        if (head.ByteSizeLong() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the update but its rows is ", head.ByteSizeLong(),
              " bytes, more than a backup can parse (2 GiB): the dense variables of one shard"));
        }
        AppendPart(head, &bytes);
        return absl::OkStatus();
      });
  if (!parts.ok()) return parts;
  if (static_cast<int64_t>(bytes.size()) > kMaxReplicaUpdateBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the update is ", bytes.size(),
                                                   " bytes, more than the ", kMaxReplicaUpdateBytes,
                                                   " a backup takes"));
  }
  return ReplicaPieces(std::move(bytes), max_piece_bytes, update.epoch());
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
  update_.reset();
  taken_ = 0;
  total_ = 0;
}

bool ReplicaAssembly::ParseWholeParts() {
  size_t at = 0;
  while (bytes_.size() - at >= kLengthBytes) {
    const uint64_t length = ReadLittleEndian(bytes_.data() + at, static_cast<int>(kLengthBytes));
    if (length > uint64_t{std::numeric_limits<int32_t>::max()}) return false;
    if (length > bytes_.size() - at - kLengthBytes) break;  // the rest is to come
    const char* part = bytes_.data() + at + kLengthBytes;
    const auto size = static_cast<int>(length);
    if (!update_.has_value()) {
      update_.emplace();
      if (!update_->ParseFromArray(part, size)) return false;
    } else {
      ShardCheckpoint rows;
      if (!rows.ParseFromArray(part, size) ||
          !MergeCheckpointPiece(update_->mutable_state(), rows).ok()) {
        return false;
      }
    }
    at += kLengthBytes + length;
  }
  bytes_.erase(0, at);
  return true;
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
  if (part.offset() != taken_ || (total_ != 0 && part.total() != total_)) {
    return refuse(absl::StrCat("it does not follow the ", taken_, " bytes of ", total_,
                               " taken; the update is sent again from offset 0"));
  }
  total_ = part.total();
  bytes_.append(part.bytes());
  taken_ += size;
  if (!ParseWholeParts()) return refuse("its bytes are not an update");
  if (taken_ < total_) return std::nullopt;
  // Every byte in: a part cut short, or none, is no update.
  if (!bytes_.empty() || !update_.has_value()) return refuse("its bytes are not an update");
  ReplicaUpdate update = *std::move(update_);
  Drop();
  if (update.has_piece()) return refuse("a piece's update has pieces itself");
  return update;
}

}  // namespace pst
