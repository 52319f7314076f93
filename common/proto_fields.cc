#include "common/proto_fields.h"

#include <algorithm>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/field_mask.pb.h"
#include "google/protobuf/util/field_mask_util.h"

namespace pst {

void CopyAllFieldsBut(const google::protobuf::Message& from, std::span<const std::string_view> but,
                      google::protobuf::Message* to) {
  google::protobuf::FieldMask mask;
  const google::protobuf::Descriptor* descriptor = from.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const std::string& name = descriptor->field(i)->name();
    if (std::find(but.begin(), but.end(), name) == but.end()) mask.add_paths(name);
  }
  google::protobuf::util::FieldMaskUtil::MergeMessageTo(
      from, mask, google::protobuf::util::FieldMaskUtil::MergeOptions(), to);
}

}  // namespace pst
