// An update in pieces: cut by the sender, put back together by the backup
// in order, bit for bit, its rows in parts of their own; what does not
// follow is refused and dropped.
#include "ps_server/service/replica_pieces.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// An update with about `bytes` bytes of rows (ids and values of dim 2).
ReplicaUpdate AnUpdate(size_t bytes) {
  ReplicaUpdate update;
  update.set_epoch(3);
  update.add_workers_done(1);
  ShardCheckpoint* state = update.mutable_state();
  state->set_version(7);
  ShardCheckpoint::Embedding* table = state->add_embeddings();
  table->mutable_config()->set_name("emb");
  const size_t rows = bytes / 16;
  std::string ids(8 * rows, '\0'), values(8 * rows, '\0');
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<char>(i * 13 + 1);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<char>(i * 31 + 7);
  table->set_ids(ids);
  table->set_values(values);
  return update;
}

// `update` as the one part of an update's bytes: its length, then it.
std::string AsOnePart(const ReplicaUpdate& update) {
  const std::string serialized = update.SerializeAsString();
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(serialized.size() >> (8 * i)));
  return bytes + serialized;
}

TEST(ReplicaPiecesTest, AnUpdateCutIntoPiecesComesBackBitForBit) {
  const ReplicaUpdate update = AnUpdate(10000);
  for (const int64_t max_piece : {int64_t{1} << 20, int64_t{4096}, int64_t{333}}) {
    SCOPED_TRACE(max_piece);
    absl::StatusOr<std::vector<ReplicaUpdate>> pieces = SplitReplicaUpdate(update, max_piece);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    // The rows' parts are no larger than a piece: past 20 of them at 333.
    const int64_t total = (*pieces)[0].piece().total();
    EXPECT_GE(total, static_cast<int64_t>(update.ByteSizeLong()));
    EXPECT_LT(total, static_cast<int64_t>(update.ByteSizeLong()) + (max_piece == 333 ? 600 : 100));
    EXPECT_EQ(static_cast<int64_t>(pieces->size()), (total + max_piece - 1) / max_piece);
    ReplicaAssembly assembly;
    for (size_t i = 0; i < pieces->size(); ++i) {
      const ReplicaUpdate& piece = (*pieces)[i];
      EXPECT_EQ(piece.epoch(), 3);
      EXPECT_FALSE(piece.has_state());
      EXPECT_LE(static_cast<int64_t>(piece.piece().bytes().size()), max_piece);
      absl::StatusOr<std::optional<ReplicaUpdate>> taken = assembly.Take(piece);
      ASSERT_TRUE(taken.ok()) << taken.status();
      // Each part is parsed once whole: what waits is part of one part and
      // the piece that brought it.
      EXPECT_LE(assembly.held_bytes(), 2 * max_piece + 64);
      if (i + 1 < pieces->size()) {
        EXPECT_FALSE(taken->has_value());
      } else {
        ASSERT_TRUE(taken->has_value());
        EXPECT_EQ((*taken)->SerializeAsString(), update.SerializeAsString());
      }
    }
    EXPECT_EQ(assembly.held_bytes(), 0);
  }
}

TEST(ReplicaPiecesTest, APieceAtOffsetZeroStartsTheUpdateOver) {
  absl::StatusOr<std::vector<ReplicaUpdate>> pieces = SplitReplicaUpdate(AnUpdate(3000), 1000);
  ASSERT_TRUE(pieces.ok());
  ASSERT_GE(pieces->size(), 3u);
  ReplicaAssembly assembly;
  ASSERT_TRUE(assembly.Take((*pieces)[0]).ok());
  ASSERT_TRUE(assembly.Take((*pieces)[1]).ok());
  // The sender was cut off and sends the update again.
  for (size_t i = 0; i < pieces->size(); ++i) {
    absl::StatusOr<std::optional<ReplicaUpdate>> taken = assembly.Take((*pieces)[i]);
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(taken->has_value(), i + 1 == pieces->size());
  }
}

TEST(ReplicaPiecesTest, WhatDoesNotFollowIsRefusedAndDropped) {
  absl::StatusOr<std::vector<ReplicaUpdate>> pieces = SplitReplicaUpdate(AnUpdate(3000), 1000);
  ASSERT_TRUE(pieces.ok());
  const ReplicaUpdate first = (*pieces)[0];
  const ReplicaUpdate second = (*pieces)[1];
  const auto refused = [](ReplicaAssembly& assembly, const ReplicaUpdate& piece) {
    absl::StatusOr<std::optional<ReplicaUpdate>> taken = assembly.Take(piece);
    EXPECT_EQ(taken.status().code(), absl::StatusCode::kInvalidArgument) << taken.status();
    EXPECT_EQ(assembly.held_bytes(), 0);
    return std::string(taken.status().message());
  };
  struct Case {
    std::string name;
    bool after_first;  // sent after the first piece was taken
    ReplicaUpdate piece;
    std::string why;
  };
  std::vector<Case> cases;
  cases.push_back({"a gap", true, (*pieces)[2], "does not follow the 1000 bytes"});
  cases.push_back({"no first piece", false, second, "does not follow the 0 bytes"});
  ReplicaUpdate other_total = second;
  other_total.mutable_piece()->set_total(second.piece().total() + 1);
  cases.push_back({"another total", true, other_total, "does not follow"});
  ReplicaUpdate past_total = first;
  past_total.mutable_piece()->set_total(500);
  cases.push_back({"past its total", false, past_total, "does not lie within it"});
  ReplicaUpdate empty = first;
  empty.mutable_piece()->clear_bytes();
  cases.push_back({"empty", false, empty, "does not lie within it"});
  ReplicaUpdate huge = first;
  huge.mutable_piece()->set_total(kMaxReplicaUpdateBytes + 1);
  cases.push_back({"past the bound", false, huge, "an update has 1 to"});
  ReplicaUpdate negative = second;
  negative.mutable_piece()->set_offset(-1000);
  cases.push_back({"a negative offset", true, negative, "does not lie within it"});
  ReplicaUpdate garbage = first;
  garbage.mutable_piece()->set_total(4);
  garbage.mutable_piece()->set_bytes("\xff\xff\xff\xff");
  cases.push_back({"bytes that are no update", false, garbage, "its bytes are not an update"});
  ReplicaUpdate unframed = first;
  unframed.mutable_piece()->set_bytes(AnUpdate(100).SerializeAsString());
  unframed.mutable_piece()->set_total(static_cast<int64_t>(unframed.piece().bytes().size()));
  cases.push_back({"an update not in parts", false, unframed, "its bytes are not an update"});
  ReplicaUpdate nested_inner;
  nested_inner.mutable_piece()->set_total(1);
  ReplicaUpdate nested = first;
  nested.mutable_piece()->set_bytes(AsOnePart(nested_inner));
  nested.mutable_piece()->set_total(static_cast<int64_t>(nested.piece().bytes().size()));
  cases.push_back({"pieces in a piece", false, nested, "has pieces itself"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ReplicaAssembly assembly;
    if (c.after_first) {
      ASSERT_TRUE(assembly.Take(first).ok());
    }
    EXPECT_THAT(refused(assembly, c.piece), HasSubstr(c.why));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
