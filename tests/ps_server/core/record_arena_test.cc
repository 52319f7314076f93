// RecordArena: pieces that do not overlap, aligned, reused once given
// back, larger than a chunk where asked, and given back from another thread.
#include "ps_server/core/record_arena.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

TEST(RecordArenaTest, PiecesAreAlignedAndApartAcrossChunks) {
  // 100 000 bytes a piece: 20 to a 2 MiB chunk, so 50 pieces span 3 chunks.
  RecordArena arena(100000);
  EXPECT_EQ(arena.piece_bytes() % 64, 0u);
  EXPECT_GE(arena.piece_bytes(), 100000u);
  std::vector<unsigned char*> pieces;
  for (int i = 0; i < 50; ++i) {
    auto* piece = static_cast<unsigned char*>(arena.Take());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(piece) % 64, 0u);
    std::memset(piece, i, arena.piece_bytes());
    pieces.push_back(piece);
  }
  // Each piece still holds what was written to it: none overlaps another.
  for (int i = 0; i < 50; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(pieces[i][0], i);
    EXPECT_EQ(pieces[i][arena.piece_bytes() - 1], i);
  }
  EXPECT_EQ(arena.mapped_bytes(), 3u * (2u << 20));
}

TEST(RecordArenaTest, APieceGivenBackIsTakenAgainBeforeNewMemory) {
  RecordArena arena(4608);
  void* first = arena.Take();
  void* second = arena.Take();
  arena.Give(first);
  EXPECT_EQ(arena.Take(), first);
  EXPECT_NE(arena.Take(), second);
  EXPECT_EQ(arena.mapped_bytes(), 2u << 20);
}

TEST(RecordArenaTest, APieceLargerThanAHugePageHasAChunkOfItsOwn) {
  const size_t bytes = (3u << 20) + 100;
  RecordArena arena(bytes);
  auto* a = static_cast<unsigned char*>(arena.Take());
  auto* b = static_cast<unsigned char*>(arena.Take());
  std::memset(a, 1, bytes);
  std::memset(b, 2, bytes);
  EXPECT_EQ(a[bytes - 1], 1);
  EXPECT_EQ(b[0], 2);
  EXPECT_EQ(arena.mapped_bytes(), 2u * (4u << 20));
}

TEST(RecordArenaTest, PiecesComeBackFromAnotherThread) {
  auto arena = std::make_shared<RecordArena>(256);
  std::vector<void*> pieces;
  for (int i = 0; i < 1000; ++i) pieces.push_back(arena->Take());
  std::thread giver([&] {
    for (void* piece : pieces) arena->Give(piece);
  });
  // Taking on this thread while the other gives back: no piece twice.
  std::set<void*> taken;
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(taken.insert(arena->Take()).second);
  giver.join();
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(taken.insert(arena->Take()).second);
}

}  // namespace PST_FILE_ID
}  // namespace pst
