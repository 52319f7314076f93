#include "rpc/peek_field.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace pst {

absl::StatusOr<int32_t> PeekInt32Field(const grpc::ByteBuffer& message, int field) {
  using google::protobuf::internal::WireFormatLite;
  // A copy shares the slices (a reference count, no bytes copied); the
  // reader needs a buffer of its own to walk.
  grpc::ByteBuffer walked = message;
  grpc::ProtoBufferReader reader(&walked);
  google::protobuf::io::CodedInputStream in(&reader);
  int32_t value = 0;
  bool whole = false;  // the walk ended where the bytes do, between fields
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {
      whole = in.ConsumedEntireMessage();
      break;
    }
    if (WireFormatLite::GetTagFieldNumber(tag) == field &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t varint = 0;
      if (!in.ReadVarint64(&varint)) break;
      value = static_cast<int32_t>(varint);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      break;  // a length past the end, or a malformed group
    }
  }
  if (!whole) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request is not a protobuf message (it breaks off near byte ", in.CurrentPosition(),
        ")"));
  }
  return value;
}

}  // namespace pst
