// ChunkBuilder and ReceivedChunk against protobuf itself: what the builder
// writes is byte for byte what protobuf serializes, what the reader accepts
// is what protobuf accepts, wherever gRPC's slices happen to split it.
#include "rpc/chunk_wire.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps.pb.h"

namespace pst {
namespace PST_FILE_ID {

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

ExchangeChunk SampleChunk() {
  ExchangeChunk chunk;
  chunk.mutable_header()->set_worker(3);
  chunk.mutable_header()->set_computed_at_version(41);
  Tensor* t = chunk.mutable_header()->add_gradients();
  t->set_name("dense/kernel");
  t->add_shape(2);
  t->add_shape(5000);
  t->set_dtype(FLOAT32);
  TensorPiece* big = chunk.add_pieces();  // tensor 0, offset 0: proto3 leaves both out
  big->set_data(Bytes(20000, 'a'));
  TensorPiece* small = chunk.add_pieces();
  small->set_tensor(1);
  small->set_offset(20000);
  small->set_data(Bytes(12, 'x'));
  TensorPiece* far = chunk.add_pieces();
  far->set_tensor(70000);
  far->set_offset(int64_t{1} << 40);
  far->set_data(Bytes(5000, 'q'));
  chunk.mutable_pull()->set_min_version(41);  // field 3, as an exchange's first message sends it
  chunk.mutable_pull()->set_dtype(BFLOAT16);
  chunk.mutable_shm()->set_region(uint64_t{1} << 63);  // field 4
  chunk.mutable_shm()->set_answer_offset(4096);
  return chunk;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a byte buffer cut into slices at the given positions.
grpc::ByteBuffer Sliced(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + from, cut - from);
    from = cut;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// What ReceivedChunk found, as the ExchangeChunk protobuf would have it.
ExchangeChunk AsProto(const ReceivedChunk& chunk) {
  ExchangeChunk out;
  if (chunk.has_header()) {
    EXPECT_TRUE(chunk.ParseHeader(out.mutable_header()));
  }
  if (chunk.has_extra()) {
    EXPECT_TRUE(chunk.ParseExtra(out.mutable_pull()));
  }
  if (chunk.has_shm()) {
    EXPECT_TRUE(chunk.ParseShm(out.mutable_shm()));
  }
  for (const ReceivedChunk::Piece& piece : chunk.pieces()) {
    TensorPiece* p = out.add_pieces();
    p->set_tensor(piece.tensor);
    p->set_offset(piece.offset);
    std::string data(piece.size, '\0');
    chunk.CopyData(piece, data.data());
    p->set_data(data);
  }
  return out;
}

TEST(ChunkBuilderTest, WritesExactlyWhatProtobufSerializes) {
  const ExchangeChunk expected = SampleChunk();
  ChunkBuilder builder;
  builder.SetHeader(expected.header());
  for (const TensorPiece& piece : expected.pieces()) {
    builder.AddPiece(piece.tensor(), piece.offset(), piece.data(), nullptr);
  }
  builder.SetExtra(expected.pull());
  builder.SetShm(expected.shm());
  EXPECT_EQ(Flatten(builder.Finish()), expected.SerializeAsString());
}

TEST(ChunkBuilderTest, LargePiecesAreReferencedAndPinnedUntilGrpcDropsThem) {
  const std::string large = Bytes(1 << 16, 'L');
  const std::string small = Bytes(100, 's');
  auto owner = std::make_shared<int>(0);
  const PayloadPin pin = owner;
  ChunkBuilder builder;
  builder.AddPiece(0, 0, large, pin);
  builder.AddPiece(1, 0, small, pin);
  {
    grpc::ByteBuffer message = builder.Finish();
    EXPECT_EQ(owner.use_count(), 3);  // ours, the local pin, the large piece's slice
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(message.Dump(&slices).ok());
    bool referenced = false;
    for (const grpc::Slice& s : slices) {
      referenced |= reinterpret_cast<const char*>(s.begin()) == large.data();
    }
    EXPECT_TRUE(referenced) << "the large piece was copied";
  }
  EXPECT_EQ(owner.use_count(), 2);
}

TEST(AwaitReleaseTest, WaitsForGrpcToDropTheLastSlice) {
  const std::string large = Bytes(1 << 16, 'L');
  const PayloadPin pin = std::make_shared<char>(0);
  ChunkBuilder builder;
  builder.AddPiece(0, 0, large, pin);
  auto message = std::make_unique<grpc::ByteBuffer>(builder.Finish());
  EXPECT_FALSE(AwaitRelease(pin, absl::Milliseconds(20)));
  // The slice is dropped only once AwaitRelease has been called and has not
  // returned for a while: one that looked once and did not wait fails.
  absl::Notification calling, returned;
  std::thread dropper([&] {
    calling.WaitForNotification();
    EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
    message.reset();
  });
  calling.Notify();
  EXPECT_TRUE(AwaitRelease(pin, absl::Seconds(10)));
  returned.Notify();
  dropper.join();
}

TEST(ReceivedChunkTest, ParsesWhateverWayTheSlicesCutTheMessage) {
  const ExchangeChunk expected = SampleChunk();
  const std::string bytes = expected.SerializeAsString();
  // Every single cut within the framing at the front, and a message cut into
  // one-byte slices throughout the framing, around the big piece.
  for (size_t cut = 1; cut < 80; ++cut) {
    SCOPED_TRACE(cut);
    grpc::ByteBuffer message = Sliced(bytes, {cut});
    ReceivedChunk chunk;
    ASSERT_TRUE(chunk.Parse(&message).ok());
    EXPECT_EQ(AsProto(chunk).SerializeAsString(), bytes);
  }
  std::vector<size_t> cuts;
  for (size_t i = 1; i < 100; ++i) cuts.push_back(i);
  for (size_t i = 20000; i < bytes.size(); i += 3) cuts.push_back(i);
  grpc::ByteBuffer message = Sliced(bytes, cuts);
  ReceivedChunk chunk;
  ASSERT_TRUE(chunk.Parse(&message).ok());
  EXPECT_EQ(AsProto(chunk).SerializeAsString(), bytes);
}

TEST(ReceivedChunkTest, AcceptsExactlyWhatProtobufAcceptsForEveryTruncation) {
  const std::string bytes = SampleChunk().SerializeAsString();
  for (size_t length = 0; length <= bytes.size(); length += (length < 200 ? 1 : 997)) {
    SCOPED_TRACE(length);
    const std::string prefix = bytes.substr(0, length);
    ExchangeChunk reference;
    const bool protobuf_ok = reference.ParseFromString(prefix);
    grpc::ByteBuffer message = Sliced(prefix, {});
    ReceivedChunk chunk;
    const absl::Status ours = chunk.Parse(&message);
    EXPECT_EQ(ours.ok(), protobuf_ok) << ours;
    if (!ours.ok()) {
      EXPECT_EQ(ours.code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(ReceivedChunkTest, SkipsUnknownFieldsAndGroupsAndMergesARepeatedHeader) {
  ExchangeChunk first;
  first.mutable_header()->set_worker(1);
  ExchangeChunk second;
  second.mutable_header()->set_computed_at_version(9);
  TensorPiece* piece = second.add_pieces();
  piece->set_tensor(2);
  piece->set_data("abcd");
  std::string bytes = first.SerializeAsString();
  bytes += std::string("\x78\x05", 2);             // field 15, varint 5
  bytes += std::string("\x81\x01" "12345678", 10);  // field 16, fixed64
  bytes += std::string("\x0b\x08\x07\x0c", 4);      // field 1 as a group (proto2), skipped
  bytes += second.SerializeAsString();
  grpc::ByteBuffer message = Sliced(bytes, {3});
  ReceivedChunk chunk;
  ASSERT_TRUE(chunk.Parse(&message).ok());
  ExchangeChunk parsed = AsProto(chunk);
  EXPECT_EQ(parsed.header().worker(), 1);
  EXPECT_EQ(parsed.header().computed_at_version(), 9);
  ASSERT_EQ(parsed.pieces_size(), 1);
  EXPECT_EQ(parsed.pieces(0).tensor(), 2);
  EXPECT_EQ(parsed.pieces(0).data(), "abcd");
}

// Found by chunk_wire_fuzzer: protobuf parses each occurrence of the header
// on its own, so a field cut off at the end of one is not completed by the
// next (concatenating the occurrences' bytes would accept it).
TEST(ReceivedChunkTest, EachHeaderOccurrenceMustBeAMessageOfItsOwn) {
  const std::string bytes("\x0a\x02\x08\x80"  // worker = a varint cut off
                          "\x0a\x01\x01", 7);  // ...which this byte would end
  ExchangeChunk reference;
  ASSERT_FALSE(reference.ParseFromString(bytes));
  grpc::ByteBuffer message = Sliced(bytes, {});
  ReceivedChunk chunk;
  ASSERT_TRUE(chunk.Parse(&message).ok());  // the framing is fine
  PushRequest header;
  EXPECT_FALSE(chunk.ParseHeader(&header));
}

TEST(ReceivedChunkTest, RefusesMalformedFraming) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"field number 0", std::string("\x00\x01", 2)},
      {"a group left open", std::string("\x0b\x08\x01", 3)},
      {"a group closed by another field's tag", std::string("\x0b\x14", 2)},
      {"an end-group tag alone", std::string("\x0c", 1)},
      {"a piece longer than the message", std::string("\x12\x05\x08\x01", 4)},
      {"piece data past its piece", std::string("\x12\x03\x1a\x05" "abcde", 9)},
      {"a key of six bytes", std::string("\x88\x80\x80\x80\x80\x00\x01", 7)},
      {"a length of six bytes", std::string("\x0a\x80\x80\x80\x80\x80\x00", 7)},
      {"a varint of eleven bytes", std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12)},
  };
  for (const auto& [name, bytes] : cases) {
    SCOPED_TRACE(name);
    grpc::ByteBuffer message = Sliced(bytes, {});
    ReceivedChunk chunk;
    absl::Status status = chunk.Parse(&message);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    ExchangeChunk reference;
    EXPECT_FALSE(reference.ParseFromString(bytes)) << "protobuf accepts it";
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
