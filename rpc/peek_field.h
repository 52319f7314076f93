// One top-level field of a serialized protobuf message, read without
// parsing the rest: for a server that decides from a request's header
// field whether its (possibly large) body needs parsing at all.
#ifndef PST_RPC_PEEK_FIELD_H_
#define PST_RPC_PEEK_FIELD_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"

namespace pst {

// The value of the top-level varint field number `field` of the message in
// `message` (the last one, as protobuf keeps; 0, proto3's default, when
// absent), truncated to 32 bits as an int32 field is. Every other field is
// skipped by its length, so the cost is a few bytes per top-level field,
// whatever the message's size. InvalidArgument if the bytes do not frame
// as protobuf fields. `message` is not changed.
absl::StatusOr<int32_t> PeekInt32Field(const grpc::ByteBuffer& message, int field);

}  // namespace pst

#endif  // PST_RPC_PEEK_FIELD_H_
