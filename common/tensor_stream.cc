#include "common/tensor_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tensor_codec.h"

namespace pst {
namespace {

constexpr int64_t kMaxStreamTensorBytes = int64_t{1} << 40;

}  // namespace

absl::StatusOr<int64_t> AnnouncedBytes(const Tensor& header) {
  const int element_bytes = DTypeBytes(header.dtype());
  if (element_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", header.name(), "\" has unknown dtype ",
                     static_cast<int>(header.dtype()), "; use FLOAT32, FLOAT16 or BFLOAT16"));
  }
  int64_t bytes = element_bytes;
  for (int64_t d : header.shape()) {
    if (d < 0 || (d > 0 && bytes > kMaxStreamTensorBytes / d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", header.name(), "\" announces an impossible shape (dimension ", d, ")"));
    }
    bytes *= d;
  }
  return bytes;
}

std::vector<std::vector<PieceRef>> PlanChunks(std::span<const int64_t> tensor_bytes,
                                              std::span<const int> element_bytes,
                                              int64_t chunk_bytes) {
  std::vector<std::vector<PieceRef>> chunks(1);
  int64_t room = chunk_bytes;
  for (size_t t = 0; t < tensor_bytes.size(); ++t) {
    const int64_t element = element_bytes[t];
    int64_t offset = 0;
    while (offset < tensor_bytes[t]) {
      // Whole elements only; a chunk smaller than one element still carries one.
      int64_t take = std::min(tensor_bytes[t] - offset, room / element * element);
      if (take == 0 && room == chunk_bytes) take = element;
      if (take == 0) {
        chunks.emplace_back();
        room = chunk_bytes;
        continue;
      }
      chunks.back().push_back(PieceRef{static_cast<int>(t), offset, take});
      offset += take;
      room -= std::min(room, take);
    }
  }
  return chunks;
}

PieceSequence::PieceSequence(std::vector<int64_t> tensor_bytes, std::vector<int> element_bytes)
    : tensor_bytes_(std::move(tensor_bytes)), element_bytes_(std::move(element_bytes)) {
  SkipComplete();
}

void PieceSequence::SkipComplete() {
  while (tensor_ < tensor_bytes_.size() && offset_ == tensor_bytes_[tensor_]) {
    ++tensor_;
    offset_ = 0;
  }
}

absl::Status PieceSequence::Accept(int tensor, int64_t offset, int64_t bytes) {
  if (tensor < 0 || static_cast<size_t>(tensor) >= tensor_bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a piece names tensor ", tensor, ", but the stream's header has ", tensor_bytes_.size(),
        " tensors"));
  }
  if (tensor_ >= tensor_bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a piece of tensor ", tensor, " arrived after every tensor was complete (too many bytes)"));
  }
  if (static_cast<size_t>(tensor) != tensor_ || offset != offset_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a piece of tensor ", tensor, " at byte ", offset, " arrived out of order; expected tensor ",
        tensor_, " at byte ", offset_));
  }
  if (bytes > tensor_bytes_[tensor_] - offset_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a piece of ", bytes, " bytes overruns tensor ", tensor, ", which has ",
        tensor_bytes_[tensor_] - offset_, " bytes left (too many bytes)"));
  }
  if (bytes == 0 || bytes % element_bytes_[tensor_] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a piece of ", bytes, " bytes of tensor ", tensor, " is not a whole number of its ",
        element_bytes_[tensor_], "-byte elements"));
  }
  offset_ += bytes;
  SkipComplete();
  return absl::OkStatus();
}

absl::Status PieceSequence::Finish() const {
  if (tensor_ < tensor_bytes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the stream ended with tensor ", tensor_, " incomplete (", offset_, " of ",
        tensor_bytes_[tensor_], " bytes arrived): missing chunks"));
  }
  return absl::OkStatus();
}

}  // namespace pst
