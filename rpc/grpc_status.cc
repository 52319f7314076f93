#include "rpc/grpc_status.h"

#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace pst {
namespace status_details {

// google.rpc.Status: code = 1 (varint), message = 2, repeated Any details
// = 3; google.protobuf.Any: type_url = 1, value = 2. Written and read here
// in protobuf's wire format, field by field.
constexpr uint32_t kStatusCode = 1;
constexpr uint32_t kStatusMessage = 2;
constexpr uint32_t kStatusDetails = 3;
constexpr uint32_t kAnyTypeUrl = 1;
constexpr uint32_t kAnyValue = 2;
constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;

void PutVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void PutBytes(uint32_t field, absl::string_view bytes, std::string* out) {
  PutVarint((field << 3) | kLengthDelimited, out);
  PutVarint(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}

std::string EncodeDetails(const absl::Status& status) {
  std::string details;
  PutVarint((kStatusCode << 3) | kVarint, &details);
  PutVarint(static_cast<uint32_t>(status.code()), &details);
  PutBytes(kStatusMessage, status.message(), &details);
  status.ForEachPayload([&](absl::string_view type_url, const absl::Cord& value) {
    std::string any;
    PutBytes(kAnyTypeUrl, type_url, &any);
    PutBytes(kAnyValue, std::string(value), &any);
    PutBytes(kStatusDetails, any, &details);
  });
  return details;
}

bool GetVarint(absl::string_view* in, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// One field of a message: its number and, for a length-delimited one, its
// bytes (a varint's are skipped). False where the message does not parse or
// holds a wire type other than these two.
bool GetField(absl::string_view* in, uint32_t* field, absl::string_view* bytes) {
  uint64_t tag = 0;
  uint64_t value = 0;
  if (!GetVarint(in, &tag) || !GetVarint(in, &value)) return false;
  *field = static_cast<uint32_t>(tag >> 3);
  *bytes = {};
  if ((tag & 7) == kVarint) return true;
  if ((tag & 7) != kLengthDelimited || value > in->size()) return false;
  *bytes = in->substr(0, value);
  in->remove_prefix(value);
  return true;
}

// Takes the details' Any entries as `status`'s payloads; stops at the first
// that does not parse.
void DecodeDetails(absl::string_view details, absl::Status* status) {
  uint32_t field = 0;
  absl::string_view bytes;
  while (!details.empty() && GetField(&details, &field, &bytes)) {
    if (field != kStatusDetails) continue;
    absl::string_view type_url;
    absl::string_view value;
    absl::string_view any = bytes;
    while (!any.empty()) {
      if (!GetField(&any, &field, &bytes)) return;
      if (field == kAnyTypeUrl) type_url = bytes;
      if (field == kAnyValue) value = bytes;
    }
    if (type_url.empty()) return;
    status->SetPayload(type_url, absl::Cord(value));
  }
}

bool HasPayloads(const absl::Status& status) {
  bool any = false;
  status.ForEachPayload([&](absl::string_view, const absl::Cord&) { any = true; });
  return any;
}

}  // namespace status_details

using status_details::DecodeDetails;
using status_details::EncodeDetails;
using status_details::HasPayloads;

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  if (!HasPayloads(status)) return grpc::Status(code, std::string(status.message()));
  return grpc::Status(code, std::string(status.message()), EncodeDetails(status));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  if (!status.error_details().empty()) DecodeDetails(status.error_details(), &converted);
  return converted;
}

}  // namespace pst
