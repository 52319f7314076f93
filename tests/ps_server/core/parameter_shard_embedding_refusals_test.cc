// Embedding rows a shard refuses (another shard's, not finite, an unknown
// table, past the reply bound), and a push with rows is never streamed.
#include "absl/synchronization/notification.h"

#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"
#include "tests/ps_server/core/parameter_shard_embedding_testing.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace shard_embedding_testing;  // NOLINT(build/namespaces)

// An id of shard 1 of 2, for shard 0.
uint64_t IdOfShardOne() {
  uint64_t id = 0;
  while (ShardOfRow(id, 2) != 1) ++id;
  return id;
}
uint64_t IdOfShardZero() {
  uint64_t id = 0;
  while (ShardOfRow(id, 2) != 0) ++id;
  return id;
}

TEST(ParameterShardEmbeddingTest, RowsOfAnotherShardAreRefusedAndChangeNothing) {
  auto shard = MakeShard(Options(ASYNC, 1, /*shard=*/0, /*num_shards=*/2));
  Init(shard.get());
  const uint64_t mine = IdOfShardZero(), theirs = IdOfShardOne();
  const Pulled before = PullAll(shard.get(), {mine});
  PushResponse response;
  const absl::Status pushed =
      Push(*shard, RowPush(0, 0, {mine, theirs}, std::vector<float>(2 * kDim, 1)), &response);
  EXPECT_EQ(pushed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pushed.message(), HasSubstr("belongs to shard 1"));
  EXPECT_EQ(shard->version(), 0);
  const Pulled after = PullAll(shard.get(), {mine});
  EXPECT_EQ(after.rows, before.rows);
  EXPECT_THAT(after.dense, ElementsAre(0.0f, 0.0f));
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.pushes_rejected(), 1);
  EXPECT_EQ(stats.embeddings(0).rows(), 0);

  PullRequest pull;
  *pull.add_rows() = Rows({theirs});
  PullResponse answer;
  const absl::Status pulled = Pull(*shard, pull, absl::Now(), &answer);
  EXPECT_EQ(pulled.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pulled.message(), HasSubstr("belongs to shard 1"));
}

TEST(ParameterShardEmbeddingTest, ANonFiniteRowIsRefusedEvenWhenTheDenseGradientsWereChecked) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get());
  std::vector<float> values(kDim, 1);
  values[2] = std::numeric_limits<float>::quiet_NaN();
  PushResponse response;
  // A transport that checked the dense gradients as they arrived says so;
  // the rows are still checked.
  const absl::Status status =
      Push(*shard, RowPush(0, 0, {3}, values), &response, {.values_finite = true});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("id 3"));
  EXPECT_EQ(shard->version(), 0);
  StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.embeddings(0).rows(), 0);
}

TEST(ParameterShardEmbeddingTest, APullOfAnUnknownTableIsRefused) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get());
  PullRequest pull;
  EmbeddingRows rows = Rows({1});
  rows.set_table("nope");
  *pull.add_rows() = rows;
  PullResponse answer;
  const absl::Status status = Pull(*shard, pull, absl::Now(), &answer);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("\"nope\""));
}

TEST(ParameterShardEmbeddingTest, APullWhoseRowsExceedTheReplyBoundIsRefusedBeforeEncoding) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get());
  std::vector<uint64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  PullRequest pull;
  *pull.add_rows() = Rows(ids);
  PullResponse answer;
  const absl::Status status =
      Pull(*shard, pull, absl::Now(), &answer, {.max_reply_bytes = 1000 * kDim});
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("1000 embedding rows"));
  EXPECT_EQ(answer.rows_size(), 0);
  ASSERT_TRUE(Pull(*shard, pull, absl::Now(), &answer, {.max_reply_bytes = 1000 * kDim * 8}).ok());
  EXPECT_EQ(answer.rows(0).data().size(), 1000u * kDim * sizeof(float));
}

TEST(ParameterShardEmbeddingTest, APushWithRowsIsNeverStreamedIntoTheUpdate) {
  auto shard = MakeShard(Options(ASYNC, 1));
  Init(shard.get());
  PushRequest header = RowPush(0, 0, {1}, std::vector<float>(kDim, 1));
  header.mutable_gradients(0)->clear_data();
  absl::StatusOr<ParameterShard::StreamedPush> push = shard->BeginStreamedPush(header);
  ASSERT_TRUE(push.ok()) << push.status();
  EXPECT_EQ(push->update, nullptr);  // reassembled, then pushed whole
  EXPECT_FALSE(push->awaits_turn);
  EXPECT_THAT(push->bytes, ElementsAre(2 * static_cast<int64_t>(sizeof(float))));
  EXPECT_FALSE(shard->streamed_update_staged());
}

}  // namespace PST_FILE_ID
}  // namespace pst
