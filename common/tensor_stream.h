// Chunked tensor streams: how a Push or Pull larger than one chunk is cut
// into messages of at most kChunkBytes of payload, and the rules a receiver
// enforces while putting it back together (proto/ps.proto: ExchangeChunk,
// ExchangeAnswer, TensorPiece).
//
// A stream is a header (the tensors' names, shapes and dtypes) and then
// pieces: the tensors in header order, each front to back, every piece whole
// elements of its tensor's dtype. Several small tensors share one message; a
// large one spans several. Nothing here touches gRPC or copies payloads: the
// sender asks PlanChunks what goes where, the receiver asks PieceSequence
// whether the next piece is the one it expects, then copies it itself.
#ifndef PST_COMMON_TENSOR_STREAM_H_
#define PST_COMMON_TENSOR_STREAM_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps.pb.h"

namespace pst {

// Payload bytes per stream message: big enough that per-message costs
// vanish, small enough that no message buffer is ever a fresh large mapping.
inline constexpr int64_t kChunkBytes = 1 << 20;

// The payload size a header tensor announces: product(shape) elements of its
// dtype. InvalidArgument, naming the tensor, for an unknown dtype, a negative
// dimension or a size past 2^40 bytes.
absl::StatusOr<int64_t> AnnouncedBytes(const Tensor& header);

struct PieceRef {
  int tensor;
  int64_t offset;  // bytes into the tensor's payload
  int64_t bytes;
};

// The messages of a stream carrying tensors of `tensor_bytes` bytes (elements
// of `element_bytes` each): every message holds at most `chunk_bytes` of
// payload (at least one element), and concatenated the pieces cover every
// tensor in order. A stream of empty tensors has one message with no pieces.
std::vector<std::vector<PieceRef>> PlanChunks(std::span<const int64_t> tensor_bytes,
                                              std::span<const int> element_bytes,
                                              int64_t chunk_bytes = kChunkBytes);

// The receiver's side: accepts pieces only in the order PlanChunks produces
// them (any chunk size), refusing with InvalidArgument a piece that names no
// tensor of the header, comes out of order, overruns its tensor or splits an
// element; Finish refuses a stream that ended early.
class PieceSequence {
 public:
  PieceSequence(std::vector<int64_t> tensor_bytes, std::vector<int> element_bytes);

  absl::Status Accept(int tensor, int64_t offset, int64_t bytes);
  absl::Status Finish() const;

 private:
  // Moves the cursor past tensors that are complete.
  void SkipComplete();

  std::vector<int64_t> tensor_bytes_;
  std::vector<int> element_bytes_;
  size_t tensor_ = 0;   // the tensor the next piece must belong to
  int64_t offset_ = 0;  // and the byte it must start at
};

}  // namespace pst

#endif  // PST_COMMON_TENSOR_STREAM_H_
