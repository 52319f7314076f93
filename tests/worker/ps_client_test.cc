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
