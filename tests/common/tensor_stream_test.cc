// Chunked tensor streams: the plan a sender follows and the order a receiver
// enforces, at every boundary of the chunk size and with 16-bit elements.
#include "common/tensor_stream.h"

#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr int64_t kChunk = 64;  // bytes; small so that "many chunks" stays cheap

struct Stream {
  std::vector<int64_t> bytes;
  std::vector<int> element_bytes;
};

// Tensors of `elements[i]` elements of `element_bytes[i]` bytes.
Stream Tensors(std::vector<int64_t> elements, std::vector<int> element_bytes) {
  Stream stream{{}, element_bytes};
  for (size_t i = 0; i < elements.size(); ++i) stream.bytes.push_back(elements[i] * element_bytes[i]);
  return stream;
}

TEST(TensorStreamTest, PlanCoversEveryByteInOrderWithinTheChunkSize) {
  struct Case {
    const char* name;
    Stream stream;
    size_t expected_chunks;
  };
  const std::vector<Case> cases = {
      {"no tensors", Tensors({}, {}), 1},
      {"one empty tensor", Tensors({0}, {4}), 1},
      {"one element", Tensors({1}, {4}), 1},
      {"chunk - 1 element", Tensors({15}, {4}), 1},
      {"exactly one chunk", Tensors({16}, {4}), 1},
      {"chunk + 1 element", Tensors({17}, {4}), 2},
      {"many chunks", Tensors({16 * 7 + 3}, {4}), 8},
      {"16-bit, odd count below a chunk", Tensors({31}, {2}), 1},
      {"16-bit, exactly one chunk", Tensors({32}, {2}), 1},
      {"16-bit, odd count past a chunk", Tensors({33}, {2}), 2},
      {"16-bit, many chunks, odd", Tensors({32 * 5 + 1}, {2}), 6},
      {"small tensors share a chunk", Tensors({3, 0, 5, 2}, {4, 4, 4, 4}), 1},
      // 3 half elements (6 bytes) then float32: no piece may split an element.
      {"mixed element sizes", Tensors({3, 20, 7, 1}, {2, 4, 2, 4}), 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto chunks = PlanChunks(c.stream.bytes, c.stream.element_bytes, kChunk);
    EXPECT_EQ(chunks.size(), c.expected_chunks);
    PieceSequence sequence(c.stream.bytes, c.stream.element_bytes);
    std::vector<int64_t> covered(c.stream.bytes.size(), 0);
    for (const auto& chunk : chunks) {
      int64_t chunk_bytes = 0;
      for (const PieceRef& piece : chunk) {
        EXPECT_EQ(piece.bytes % c.stream.element_bytes[piece.tensor], 0);
        EXPECT_EQ(piece.offset, covered[piece.tensor]);
        covered[piece.tensor] += piece.bytes;
        chunk_bytes += piece.bytes;
        EXPECT_TRUE(sequence.Accept(piece.tensor, piece.offset, piece.bytes).ok());
      }
      EXPECT_LE(chunk_bytes, kChunk);
    }
    EXPECT_EQ(covered, c.stream.bytes);
    EXPECT_TRUE(sequence.Finish().ok());
  }
}

TEST(TensorStreamTest, AChunkSmallerThanAnElementStillCarriesOne) {
  const auto chunks = PlanChunks(std::vector<int64_t>{12}, std::vector<int>{4}, 2);
  ASSERT_EQ(chunks.size(), 3u);
  for (const auto& chunk : chunks) EXPECT_EQ(chunk.at(0).bytes, 4);
}

TEST(TensorStreamTest, MalformedSequencesAreRefused) {
  // Two tensors: 8 float32 values, then 3 halves (6 bytes).
  const Stream stream = Tensors({8, 3}, {4, 2});
  struct Piece {
    int tensor;
    int64_t offset;
    int64_t bytes;
  };
  struct Case {
    const char* name;
    std::vector<Piece> pieces;
    const char* error;  // from Accept, or from Finish when every piece was taken
  };
  const std::vector<Case> cases = {
      {"unknown tensor", {{2, 0, 4}}, "names tensor 2"},
      {"negative tensor", {{-1, 0, 4}}, "names tensor -1"},
      {"second tensor first", {{1, 0, 6}}, "out of order"},
      {"repeated piece", {{0, 0, 16}, {0, 0, 16}}, "out of order"},
      {"gap", {{0, 0, 16}, {0, 20, 12}}, "out of order"},
      {"overrun", {{0, 0, 36}}, "too many bytes"},
      {"after the end", {{0, 0, 32}, {1, 0, 6}, {1, 6, 2}}, "after every tensor"},
      {"split element", {{0, 0, 6}}, "whole number"},
      {"empty piece", {{0, 0, 0}}, "whole number"},
      {"missing tail", {{0, 0, 32}, {1, 0, 4}}, "missing chunks"},
      {"nothing", {}, "missing chunks"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PieceSequence sequence(stream.bytes, stream.element_bytes);
    absl::Status status;
    for (const Piece& p : c.pieces) {
      status = sequence.Accept(p.tensor, p.offset, p.bytes);
      if (!status.ok()) break;
    }
    if (status.ok()) status = sequence.Finish();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.error));
  }
}

TEST(TensorStreamTest, AnnouncedBytesFollowShapeAndDtype) {
  Tensor tensor;
  tensor.set_name("w");
  tensor.add_shape(3);
  tensor.add_shape(5);
  tensor.set_dtype(FLOAT16);
  EXPECT_EQ(*AnnouncedBytes(tensor), 30);
  tensor.set_dtype(DTYPE_UNSPECIFIED);
  EXPECT_EQ(*AnnouncedBytes(tensor), 60);
  tensor.set_dtype(static_cast<DType>(9));
  EXPECT_EQ(AnnouncedBytes(tensor).status().code(), absl::StatusCode::kInvalidArgument);
  tensor.set_dtype(FLOAT32);
  tensor.add_shape(int64_t{1} << 40);
  EXPECT_EQ(AnnouncedBytes(tensor).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace PST_FILE_ID
}  // namespace pst
