// The messages of the data plane's one call, Exchange (ExchangeChunk and
// ExchangeAnswer in proto/ps.proto), as gRPC byte buffers, built and read
// without protobuf copying their payloads.
//
// On the wire these are ordinary serialized ExchangeChunk / ExchangeAnswer messages,
// so a client built from ps.proto alone speaks the same protocol. What
// differs is where the bytes go: a built message's slices point straight
// into the sender's tensor memory (the kernel's copy into the socket is the
// only one), and a received message is parsed over gRPC's receive slices,
// each piece copied once, straight to where it belongs. TensorFlow's
// grpc_tensor_coding / TensorResponse do the same for its tensors.
#ifndef PST_RPC_CHUNK_WIRE_H_
#define PST_RPC_CHUNK_WIRE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace pst {

// The data method of service ParameterServer (proto/ps.proto), which both
// ends call and serve with byte buffers built and read here instead of
// through the generated ExchangeChunk / ExchangeAnswer code.
inline constexpr char kExchangeMethod[] = "/pst.ParameterServer/Exchange";

// Keeps memory that a built message references alive and unchanged for as
// long as gRPC holds a slice of it: every referenced piece holds one count
// of the pin until gRPC releases the piece, which can be after the Write
// that sent it has returned. The owner may change the memory again once its
// own count is the only one left (use_count() == 1).
using PayloadPin = std::shared_ptr<const void>;

// Waits up to `timeout` until `pin` holds the only count left; true if it
// does. For memory a caller owns and may change as soon as a call returns.
bool AwaitRelease(const PayloadPin& pin, absl::Duration timeout);

// Builds one stream message.
class ChunkBuilder {
 public:
  // The first message's header: a PushRequest or PullResponse whose tensors
  // carry no data.
  void SetHeader(const google::protobuf::MessageLite& header);
  // Field 3 of the message: an exchange's PullRequest (ExchangeChunk.pull)
  // or its ExchangeDone (ExchangeAnswer.done).
  void SetExtra(const google::protobuf::MessageLite& extra);
  // Field 4: an exchange's ShmTransfer (ExchangeChunk.shm).
  void SetShm(const google::protobuf::MessageLite& shm);

  // The piece of tensor `tensor` that starts `offset` bytes into its
  // payload. Large pieces are referenced, not copied, and counted in `pin`;
  // small ones are copied.
  void AddPiece(int tensor, int64_t offset, std::span<const char> data, const PayloadPin& pin);

  // The message built so far, as gRPC sends it; the builder starts afresh.
  grpc::ByteBuffer Finish();

 private:
  // Turns the bytes gathered in `inline_` into a slice of their own.
  void FlushInline();

  std::string inline_;  // framing and small payloads not yet in a slice
  std::vector<grpc::Slice> slices_;
};

// One received stream message, parsed: its header, if it has one, and where
// each piece's data lies in gRPC's receive buffers, which it keeps until the
// next Parse.
class ReceivedChunk {
 public:
  struct Piece {
    int tensor = 0;
    int64_t offset = 0;
    int64_t size = 0;  // bytes of data
    size_t slice = 0;  // the data starts in slices_[slice] at byte `start`
    size_t start = 0;
  };

  // Takes `message`'s bytes and parses them. InvalidArgument if they are not
  // a well-formed serialized ExchangeChunk or ExchangeAnswer.
  absl::Status Parse(grpc::ByteBuffer* message);

  bool has_header() const { return !headers_.empty(); }
  // Parses the header into `header` (a PushRequest or PullResponse) as
  // protobuf would: each occurrence of the field on its own, merged in
  // order. False if one is not a valid message.
  bool ParseHeader(google::protobuf::MessageLite* header) const;
  // The same for field 3 (ChunkBuilder::SetExtra).
  bool has_extra() const { return !extras_.empty(); }
  bool ParseExtra(google::protobuf::MessageLite* extra) const;
  // The same for field 4 (ChunkBuilder::SetShm).
  bool has_shm() const { return !shms_.empty(); }
  bool ParseShm(google::protobuf::MessageLite* shm) const;
  const std::vector<Piece>& pieces() const { return pieces_; }

  // Copies the piece's piece.size data bytes to `dest`.
  void CopyData(const Piece& piece, char* dest) const;

  // Reads a piece's data front to back in steps of the caller's choosing,
  // e.g. a cache-sized block at a time. Valid until the chunk's next Parse.
  class PieceReader {
   public:
    PieceReader(const ReceivedChunk& chunk, const Piece& piece);
    int64_t left() const { return left_; }
    // Copies the next `size` bytes (at most left()) to `dest`.
    void Read(int64_t size, char* dest);

   private:
    const std::vector<grpc::Slice>& slices_;
    size_t slice_;
    size_t start_;
    int64_t left_;
  };

 private:
  std::vector<grpc::Slice> slices_;
  // Each occurrence's bytes of fields 1, 3 and 4.
  std::vector<std::string> headers_;
  std::vector<std::string> extras_;
  std::vector<std::string> shms_;
  std::vector<Piece> pieces_;
};

}  // namespace pst

#endif  // PST_RPC_CHUNK_WIRE_H_
