#include "rpc/chunk_wire.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"

namespace pst {
namespace {

// Protobuf wire types and the field numbers of ExchangeChunk /
// ExchangeAnswer and TensorPiece (proto/ps.proto).
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4,
              kFixed32 = 5;
// protobuf's default recursion limit: how deep messages and groups may nest.
constexpr int kRecursionLimit = 100;
constexpr int kHeaderField = 1, kPiecesField = 2, kExtraField = 3, kShmField = 4;
constexpr int kTensorField = 1, kOffsetField = 2, kDataField = 3;

// Pieces up to this size are copied into the framing around them: a slice
// of their own would cost more than the copy.
constexpr size_t kReferenceAtLeast = 4096;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

int VarintSize(uint64_t value) {
  int size = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++size;
  }
  return size;
}

void AppendKey(int field, int wire_type, std::string* out) {
  AppendVarint(static_cast<uint64_t>(field) << 3 | wire_type, out);
}

// Reads a message spread over slices, front to back.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) remaining_ += static_cast<int64_t>(s.size());
    SkipExhausted();
  }

  int64_t remaining() const { return remaining_; }
  size_t slice() const { return slice_; }
  size_t position() const { return position_; }

  // A varint of at most ten bytes, as protobuf reads values.
  bool ReadVarint(uint64_t* value) { return ReadVarintOf(10, value); }

  // A field key as protobuf reads it: at most five bytes, the value kept to
  // its low 32 bits.
  bool ReadKey(uint64_t* key) {
    if (!ReadVarintOf(5, key)) return false;
    *key &= 0xffffffffu;
    return true;
  }

  // A length as protobuf reads it: at most five bytes, and below 2 GiB less
  // protobuf's 16 bytes of slop.
  bool ReadLength(uint64_t* length) {
    return ReadVarintOf(5, length) && *length <= 0x7fffffffu - 16;
  }

  bool Skip(uint64_t bytes) {
    if (bytes > static_cast<uint64_t>(remaining_)) return false;
    while (bytes > 0) {
      const size_t step =
          std::min<uint64_t>(bytes, slices_[slice_].size() - position_);
      Advance(step);
      bytes -= step;
    }
    return true;
  }

 private:
  bool ReadVarintOf(int max_bytes, uint64_t* value) {
    *value = 0;
    for (int i = 0; i < max_bytes; ++i) {
      if (remaining_ == 0) return false;
      const uint8_t byte = slices_[slice_].begin()[position_];
      Advance(1);
      *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  void Advance(size_t bytes) {
    position_ += bytes;
    remaining_ -= static_cast<int64_t>(bytes);
    SkipExhausted();
  }
  void SkipExhausted() {
    while (slice_ < slices_.size() && position_ == slices_[slice_].size()) {
      ++slice_;
      position_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t position_ = 0;
  int64_t remaining_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed stream message: ", what));
}

// Skips a field of `wire_type` whose key (of field `field`) has been read,
// staying within the enclosing message, which ends where `remaining()` is
// `end`. Groups (a proto2 encoding no proto3 writer emits) are skipped as
// protobuf skips them, nesting at most `depth` deep: protobuf's recursion
// limit, less the messages around this one.
absl::Status SkipField(uint64_t field, int wire_type, int64_t end, int depth, Cursor* cursor) {
  uint64_t value = 0;
  bool ok = false;
  switch (wire_type) {
    case kVarint: ok = cursor->ReadVarint(&value); break;
    case kFixed64: ok = cursor->remaining() - end >= 8 && cursor->Skip(8); break;
    case kFixed32: ok = cursor->remaining() - end >= 4 && cursor->Skip(4); break;
    case kLengthDelimited:
      ok = cursor->ReadLength(&value) && cursor->remaining() >= end &&
           value <= static_cast<uint64_t>(cursor->remaining() - end) && cursor->Skip(value);
      break;
    case kStartGroup: {
      if (depth == 0) return Malformed("groups nest too deep");
      while (true) {
        uint64_t key = 0;
        if (!cursor->ReadKey(&key) || cursor->remaining() < end) {
          return Malformed("a group has no end");
        }
        if ((key & 7) == kEndGroup) {
          if (key >> 3 != field) return Malformed("a group ends with another group's tag");
          return absl::OkStatus();
        }
        if (key >> 3 == 0) return Malformed("field number 0");
        if (absl::Status s = SkipField(key >> 3, static_cast<int>(key & 7), end, depth - 1, cursor);
            !s.ok()) {
          return s;
        }
      }
    }
    default: return Malformed(absl::StrCat("unexpected wire type ", wire_type));
  }
  return ok && cursor->remaining() >= end
             ? absl::OkStatus()
             : Malformed("a field runs past the end of its message");
}

// Reads one TensorPiece, which ends where `cursor->remaining()` is `end`.
absl::Status ParsePiece(int64_t end, Cursor* cursor, ReceivedChunk::Piece* piece) {
  piece->slice = cursor->slice();
  piece->start = cursor->position();
  while (cursor->remaining() > end) {
    uint64_t key = 0;
    if (!cursor->ReadKey(&key) || cursor->remaining() < end) {
      return Malformed("a piece's field key is cut off");
    }
    const uint64_t field = key >> 3;
    const int wire_type = static_cast<int>(key & 7);
    uint64_t value = 0;
    if (field == 0) return Malformed("field number 0 in a piece");
    if ((field == kTensorField || field == kOffsetField) && wire_type == kVarint) {
      if (!cursor->ReadVarint(&value) || cursor->remaining() < end) {
        return Malformed("a piece's tensor or offset is cut off");
      }
      // Truncated to the field's type, as protobuf does.
      if (field == kTensorField) {
        piece->tensor = static_cast<int32_t>(value);
      } else {
        piece->offset = static_cast<int64_t>(value);
      }
    } else if (field == kDataField && wire_type == kLengthDelimited) {
      if (!cursor->ReadLength(&value) || cursor->remaining() < end ||
          value > static_cast<uint64_t>(cursor->remaining() - end)) {
        return Malformed("a piece's data runs past the end of the piece");
      }
      piece->size = static_cast<int64_t>(value);
      piece->slice = cursor->slice();
      piece->start = cursor->position();
      cursor->Skip(value);
    } else if (absl::Status s = SkipField(field, wire_type, end, kRecursionLimit - 1, cursor);
               !s.ok()) {
      return s;
    }
    if (cursor->remaining() < end) return Malformed("a piece's field runs past the piece");
  }
  return absl::OkStatus();
}

}  // namespace

bool AwaitRelease(const PayloadPin& pin, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (pin.use_count() > 1) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(50));
  }
  // gRPC's last read of the memory happened before it dropped its count.
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}

void ChunkBuilder::SetHeader(const google::protobuf::MessageLite& header) {
  AppendKey(kHeaderField, kLengthDelimited, &inline_);
  AppendVarint(header.ByteSizeLong(), &inline_);
  header.AppendToString(&inline_);
}

void ChunkBuilder::SetExtra(const google::protobuf::MessageLite& extra) {
  AppendKey(kExtraField, kLengthDelimited, &inline_);
  AppendVarint(extra.ByteSizeLong(), &inline_);
  extra.AppendToString(&inline_);
}

void ChunkBuilder::SetShm(const google::protobuf::MessageLite& shm) {
  AppendKey(kShmField, kLengthDelimited, &inline_);
  AppendVarint(shm.ByteSizeLong(), &inline_);
  shm.AppendToString(&inline_);
}

void ChunkBuilder::AddPiece(int tensor, int64_t offset, std::span<const char> data,
                            const PayloadPin& pin) {
  // Fields as protobuf writes them: in number order, proto3 zeros left out.
  const uint64_t tensor_value = static_cast<uint64_t>(static_cast<int64_t>(tensor));
  const uint64_t offset_value = static_cast<uint64_t>(offset);
  size_t body = 0;
  if (tensor_value != 0) body += 1 + VarintSize(tensor_value);
  if (offset_value != 0) body += 1 + VarintSize(offset_value);
  if (!data.empty()) body += 1 + VarintSize(data.size()) + data.size();
  AppendKey(kPiecesField, kLengthDelimited, &inline_);
  AppendVarint(body, &inline_);
  if (tensor_value != 0) {
    AppendKey(kTensorField, kVarint, &inline_);
    AppendVarint(tensor_value, &inline_);
  }
  if (offset_value != 0) {
    AppendKey(kOffsetField, kVarint, &inline_);
    AppendVarint(offset_value, &inline_);
  }
  if (data.empty()) return;
  AppendKey(kDataField, kLengthDelimited, &inline_);
  AppendVarint(data.size(), &inline_);
  if (data.size() < kReferenceAtLeast) {
    inline_.append(data.data(), data.size());
    return;
  }
  FlushInline();
  // gRPC calls `release` when it drops its last reference to the slice;
  // until then the slice holds a count of the pin.
  auto release = [](void* held_pin) { delete static_cast<PayloadPin*>(held_pin); };
  slices_.emplace_back(const_cast<char*>(data.data()), data.size(), release, new PayloadPin(pin));
}

grpc::ByteBuffer ChunkBuilder::Finish() {
  FlushInline();
  grpc::ByteBuffer message(slices_.data(), slices_.size());
  slices_.clear();
  return message;
}

void ChunkBuilder::FlushInline() {
  if (inline_.empty()) return;
  slices_.emplace_back(inline_.data(), inline_.size());  // copies
  inline_.clear();
}

absl::Status ReceivedChunk::Parse(grpc::ByteBuffer* message) {
  slices_.clear();
  headers_.clear();
  extras_.clear();
  shms_.clear();
  pieces_.clear();
  if (grpc::Status dumped = message->Dump(&slices_); !dumped.ok()) {
    return Malformed(dumped.error_message());
  }
  message->Clear();
  Cursor cursor(slices_);
  while (cursor.remaining() > 0) {
    uint64_t key = 0;
    if (!cursor.ReadKey(&key)) return Malformed("a field key is cut off or too long");
    const uint64_t field = key >> 3;
    const int wire_type = static_cast<int>(key & 7);
    if (field == 0) return Malformed("field number 0");
    if (wire_type != kLengthDelimited ||
        (field != kHeaderField && field != kPiecesField && field != kExtraField &&
         field != kShmField)) {
      if (absl::Status s = SkipField(field, wire_type, 0, kRecursionLimit, &cursor); !s.ok()) {
        return s;
      }
      continue;
    }
    uint64_t length = 0;
    if (!cursor.ReadLength(&length) || length > static_cast<uint64_t>(cursor.remaining())) {
      return Malformed("a field runs past the end of the message");
    }
    const int64_t end = cursor.remaining() - static_cast<int64_t>(length);
    if (field != kPiecesField) {
      Piece bytes{.size = static_cast<int64_t>(length), .slice = cursor.slice(),
                  .start = cursor.position()};
      std::vector<std::string>& occurrences = field == kHeaderField  ? headers_
                                              : field == kExtraField ? extras_
                                                                     : shms_;
      occurrences.emplace_back(length, '\0');
      CopyData(bytes, occurrences.back().data());
      cursor.Skip(length);
      continue;
    }
    Piece piece;
    PST_RETURN_IF_ERROR(ParsePiece(end, &cursor, &piece));
    pieces_.push_back(piece);
  }
  return absl::OkStatus();
}

namespace {

// Parses `occurrences` into `message` as protobuf parses a repeated
// occurrence of a message field: each on its own, merged in order.
bool MergeOccurrences(const std::vector<std::string>& occurrences,
                      google::protobuf::MessageLite* message) {
  message->Clear();
  for (const std::string& bytes : occurrences) {
    google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                 static_cast<int>(bytes.size()));
    // Nested in the chunk message, as protobuf would see it.
    input.SetRecursionLimit(kRecursionLimit - 1);
    if (!message->MergeFromCodedStream(&input) || !input.ConsumedEntireMessage()) return false;
  }
  return true;
}

}  // namespace

bool ReceivedChunk::ParseHeader(google::protobuf::MessageLite* header) const {
  return MergeOccurrences(headers_, header);
}

bool ReceivedChunk::ParseExtra(google::protobuf::MessageLite* extra) const {
  return MergeOccurrences(extras_, extra);
}

bool ReceivedChunk::ParseShm(google::protobuf::MessageLite* shm) const {
  return MergeOccurrences(shms_, shm);
}

void ReceivedChunk::CopyData(const Piece& piece, char* dest) const {
  PieceReader(*this, piece).Read(piece.size, dest);
}

ReceivedChunk::PieceReader::PieceReader(const ReceivedChunk& chunk, const Piece& piece)
    : slices_(chunk.slices_), slice_(piece.slice), start_(piece.start), left_(piece.size) {}

void ReceivedChunk::PieceReader::Read(int64_t size, char* dest) {
  left_ -= size;
  while (size > 0) {
    const size_t available = slices_[slice_].size() - start_;
    const size_t step = std::min<uint64_t>(available, static_cast<uint64_t>(size));
    std::memcpy(dest, slices_[slice_].begin() + start_, step);
    dest += step;
    size -= static_cast<int64_t>(step);
    start_ += step;
    if (start_ == slices_[slice_].size()) {
      ++slice_;
      start_ = 0;
    }
  }
}

}  // namespace pst
