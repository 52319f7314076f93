// Placement of model variables on PS shards, computed by every worker alike.
#include "worker/ps_client.h"

#include <map>

#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/mlp.h"

namespace pst {
namespace {

// Placement needs only channels that connect: one gRPC server per shard
// serving the generated (unimplemented) service is enough.
class Shards {
 public:
  explicit Shards(int n) {
    for (int i = 0; i < n; ++i) {
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(&service_);
      servers_.push_back(builder.BuildAndStart());
      addresses_.push_back("127.0.0.1:" + std::to_string(port));
    }
  }
  const std::vector<std::string>& addresses() const { return addresses_; }

 private:
  ParameterServer::Service service_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::string> addresses_;
};

const std::vector<VariableSpec> kModel = {
    {"dense_0/kernel", {784, 256}}, {"dense_0/bias", {256}},  {"dense_1/kernel", {256, 128}},
    {"dense_1/bias", {128}},        {"dense_2/kernel", {128, 10}}, {"dense_2/bias", {10}}};

TEST(PsClientTest, SlicesCoverEveryVariableExactlyOnceAndBalanceTheShards) {
  for (int shards : {1, 2, 3, 4}) {
    SCOPED_TRACE(shards);
    Shards servers(shards);
    auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables(kModel);
    std::map<size_t, int64_t> covered;
    std::vector<int64_t> load(shards, 0);
    for (const PsClient::Slice& s : (*client)->slices()) {
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

TEST(PsClientTest, EveryShardHoldsAPartOfASmallModel) {
  // Nothing here is over kSliceBytes: the largest variable is cut anyway
  // when there are more shards than variables.
  const std::vector<VariableSpec> small = {{"w", {1024, 1}}, {"b", {3}}, {"s", {1}}};
  for (int shards : {2, 3, 4, 8}) {
    SCOPED_TRACE(shards);
    Shards servers(shards);
    auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
    ASSERT_TRUE(client.ok()) << client.status();
    (*client)->SetVariables(small);
    std::vector<int> pieces(shards, 0);
    std::map<size_t, int64_t> covered;
    for (const PsClient::Slice& s : (*client)->slices()) {
      ++pieces[s.shard];
      EXPECT_EQ(s.offset, covered[s.variable]) << s.name;
      covered[s.variable] += s.count;
    }
    for (int p : pieces) EXPECT_GT(p, 0);
    for (size_t v = 0; v < small.size(); ++v) EXPECT_EQ(covered[v], small[v].size());
    // Three variables fill three shards; beyond that only "w" is cut.
    EXPECT_EQ((*client)->slices().size(), shards <= 3 ? 3u : static_cast<size_t>(shards) + 2);
  }
  // One scalar cannot be cut: Init says why instead of asking a shard to
  // hold nothing.
  Shards servers(2);
  auto client = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->SetVariables({{"s", {1}}});
  const std::vector<float> one = {1.0f};
  absl::StatusOr<bool> init = (*client)->Init({one});
  EXPECT_EQ(init.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(init.status().message(), ::testing::HasSubstr("run fewer PS shards"));
}

TEST(PsClientTest, PlacementIsTheSameOnEveryWorker) {
  Shards servers(3);
  auto a = PsClient::Connect(servers.addresses(), 0, absl::Seconds(5));
  auto b = PsClient::Connect(servers.addresses(), 1, absl::Seconds(5));
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->SetVariables(kModel);
  (*b)->SetVariables(kModel);
  ASSERT_EQ((*a)->slices().size(), (*b)->slices().size());
  for (size_t i = 0; i < (*a)->slices().size(); ++i) {
    EXPECT_EQ((*a)->slices()[i].name, (*b)->slices()[i].name);
    EXPECT_EQ((*a)->slices()[i].shard, (*b)->slices()[i].shard);
  }
}

TEST(PsClientTest, UnreachableShardIsUnavailableAndNamed) {
  auto client = PsClient::Connect({"127.0.0.1:1"}, 0, absl::Milliseconds(300));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(client.status().message()), ::testing::HasSubstr("ps:0 at 127.0.0.1:1"));
}

}  // namespace
}  // namespace pst
