// The hand-written stream-message parser (rpc/chunk_wire.h) against
// protobuf's own: for any bytes, cut into gRPC slices anywhere, ReceivedChunk
// accepts exactly when ExchangeChunk::ParseFromString does, and then finds the
// same header, pieces, pull (field 3) and shm (field 4). The first byte
// picks the slice size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "ps.pb.h"
#include "rpc/chunk_wire.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // protobuf's complaints about each bad input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t slice_bytes = 1 + data[0];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<grpc::Slice> slices;
  for (size_t from = 0; from < bytes.size(); from += slice_bytes) {
    slices.emplace_back(bytes.data() + from, std::min(slice_bytes, bytes.size() - from));
  }
  grpc::ByteBuffer message(slices.data(), slices.size());
  pst::ReceivedChunk chunk;
  bool ours = chunk.Parse(&message).ok();
  // The header's own bytes are parsed by protobuf, as its receivers do.
  // So are field 3's (an exchange's PullRequest) and field 4's (its
  // ShmTransfer).
  pst::PushRequest header;
  if (ours && chunk.has_header()) ours = chunk.ParseHeader(&header);
  pst::PullRequest pull;
  if (ours && chunk.has_extra()) ours = chunk.ParseExtra(&pull);
  pst::ShmTransfer shm;
  if (ours && chunk.has_shm()) ours = chunk.ParseShm(&shm);
  pst::ExchangeChunk reference;
  const bool protobuf = reference.ParseFromString(bytes);
  if (ours != protobuf) __builtin_trap();
  if (!ours) return 0;
  if (chunk.has_header() != reference.has_header()) __builtin_trap();
  if (header.SerializeAsString() != reference.header().SerializeAsString()) {
    __builtin_trap();
  }
  if (chunk.has_extra() != reference.has_pull()) __builtin_trap();
  if (pull.SerializeAsString() != reference.pull().SerializeAsString()) __builtin_trap();
  if (chunk.has_shm() != reference.has_shm()) __builtin_trap();
  if (shm.SerializeAsString() != reference.shm().SerializeAsString()) __builtin_trap();
  if (static_cast<int>(chunk.pieces().size()) != reference.pieces_size()) __builtin_trap();
  for (size_t i = 0; i < chunk.pieces().size(); ++i) {
    const pst::ReceivedChunk::Piece& piece = chunk.pieces()[i];
    const pst::TensorPiece& expected = reference.pieces(static_cast<int>(i));
    std::string piece_data(piece.size, '\0');
    chunk.CopyData(piece, piece_data.data());
    if (piece.tensor != expected.tensor() || piece.offset != expected.offset() ||
        piece_data != expected.data()) {
      __builtin_trap();
    }
  }
  return 0;
}
