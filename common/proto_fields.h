// Copying a protobuf message but some of its fields, without touching
// those: how a large message is cut in parts (a checkpoint's state but its
// rows) without holding it twice for a moment.
#ifndef PST_COMMON_PROTO_FIELDS_H_
#define PST_COMMON_PROTO_FIELDS_H_

#include <span>
#include <string_view>

#include "google/protobuf/message.h"

namespace pst {

// Merges into `to` (of `from`'s type) every field of `from` but the
// top-level fields named in `but`, which are not read.
void CopyAllFieldsBut(const google::protobuf::Message& from, std::span<const std::string_view> but,
                      google::protobuf::Message* to);

}  // namespace pst

#endif  // PST_COMMON_PROTO_FIELDS_H_
