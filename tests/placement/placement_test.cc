// Placement of model variables on PS shards, computed by every process alike.
#include "placement/placement.h"

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pst {
namespace PST_FILE_ID {

const std::vector<VariableSpec> kModel = {{"dense_0/kernel", {784, 256}}, {"dense_0/bias", {256}},
                                          {"dense_1/kernel", {256, 128}}, {"dense_1/bias", {128}},
                                          {"dense_2/kernel", {128, 10}},  {"dense_2/bias", {10}}};

TEST(PlacementTest, SlicesCoverEveryVariableExactlyOnceAndBalanceTheShards) {
  for (int shards : {1, 2, 3, 4}) {
    SCOPED_TRACE(shards);
    std::map<size_t, int64_t> covered;
    std::vector<int64_t> load(shards, 0);
    for (const VariableSlice& s : PlaceModel(kModel, shards)) {
      EXPECT_EQ(s.offset, covered[s.variable]) << s.name;  // contiguous, in order
      covered[s.variable] += s.count;
      int64_t shape_elements = 1;
      for (int64_t d : s.shape) shape_elements *= d;
      EXPECT_EQ(shape_elements, s.count) << s.name;
      load[s.shard] += s.count;
    }
    for (size_t v = 0; v < kModel.size(); ++v) EXPECT_EQ(covered[v], kModel[v].size());
    // The 784 x 256 kernel alone is 85% of the model: without slicing one
    // shard would hold it all. With slicing no shard holds much more than
    // an even share.
    const int64_t total = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;
    for (int64_t l : load) EXPECT_LE(l, total / shards + total / 10);
  }
}

TEST(PlacementTest, EveryShardHoldsAPartOfASmallModel) {
  // Nothing here is over kSliceBytes: the largest variable is cut anyway
  // when there are more shards than variables.
  const std::vector<VariableSpec> small = {{"w", {1024, 1}}, {"b", {3}}, {"s", {1}}};
  for (int shards : {2, 3, 4, 8}) {
    SCOPED_TRACE(shards);
    const std::vector<VariableSlice> slices = PlaceModel(small, shards);
    std::vector<int> pieces(shards, 0);
    std::map<size_t, int64_t> covered;
    for (const VariableSlice& s : slices) {
      ++pieces[s.shard];
      EXPECT_EQ(s.offset, covered[s.variable]) << s.name;
      covered[s.variable] += s.count;
    }
    for (int p : pieces) EXPECT_GT(p, 0);
    for (size_t v = 0; v < small.size(); ++v) EXPECT_EQ(covered[v], small[v].size());
    // Three variables fill three shards; beyond that only "w" is cut.
    EXPECT_EQ(slices.size(), shards <= 3 ? 3u : static_cast<size_t>(shards) + 2);
    EXPECT_TRUE(CheckEveryShardHoldsASlice(slices, shards).ok());
  }
}

TEST(PlacementTest, AModelWithFewerRowsThanShardsIsRefused) {
  // One scalar cannot be cut: the check says why instead of leaving a shard
  // to hold nothing.
  const std::vector<VariableSlice> slices = PlaceModel({{"s", {1}}}, 2);
  absl::Status check = CheckEveryShardHoldsASlice(slices, 2);
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(check.message()), ::testing::HasSubstr("ps:1 would hold none"));
  EXPECT_THAT(std::string(check.message()), ::testing::HasSubstr("run fewer PS shards"));
}

TEST(PlacementTest, IsTheSameOnEveryCall) {
  const std::vector<VariableSlice> a = PlaceModel(kModel, 3);
  const std::vector<VariableSlice> b = PlaceModel(kModel, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shard, b[i].shard);
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
