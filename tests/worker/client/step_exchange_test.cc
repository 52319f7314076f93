// The layer-wise exchange (PsClient::BeginExchange) against real shards: a
// whole exchange commits one update; one abandoned part way, as when a
// worker dies between its layer pushes, leaves every variable as it was.
#include "worker/client/step_exchange.h"

#include "absl/strings/str_cat.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "gtest/gtest.h"
#include "tests/support/eventually.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

const std::vector<VariableSpec> kModel = {{"dense_0/kernel", {300, 200}}, {"dense_0/bias", {200}},
                                          {"dense_1/kernel", {200, 10}}, {"dense_1/bias", {10}}};
// Its first kernel (32 MiB) takes more messages to each shard than the
// connection takes at once.
const std::vector<VariableSpec> kLargeModel = {{"dense_0/kernel", {4096, 2048}},
                                               {"dense_0/bias", {2048}},
                                               {"dense_1/kernel", {2048, 10}},
                                               {"dense_1/bias", {10}}};
// Backward's order: the last layer first.
const std::vector<int> kPushOrder = {2, 3, 0, 1};

JobConfig ConfigFor(Mode mode) {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(1);
  // The test's client brings its own variables (kModel), not the MLP below.
  config.mutable_cluster()->set_worker_command("step_exchange_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(mode);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.5f);
  t->mutable_model()->mutable_mlp()->add_hidden(200);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

struct Connected {
  std::unique_ptr<InProcessCluster> cluster;
  std::unique_ptr<PsClient> client;
  std::vector<std::vector<float>> initial, gradients, out;
};

// Two shards holding `model` (the big kernel sliced over both), initialized.
Connected Connect(Mode mode, const std::vector<VariableSpec>& model = kModel) {
  Connected c;
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(ConfigFor(mode), 2);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  c.cluster = std::move(*cluster);
  const auto& ps = c.cluster->config().cluster().ps();
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(
      std::vector<std::string>(ps.begin(), ps.end()), 0, absl::Seconds(10));
  EXPECT_TRUE(client.ok()) << client.status();
  c.client = std::move(*client);
  c.client->SetVariables(model);
  EXPECT_TRUE(c.client->Register().ok());
  for (const VariableSpec& v : model) {
    c.initial.emplace_back(v.size(), 1.0f);
    c.gradients.emplace_back(v.size(), 2.0f);
    c.out.emplace_back(v.size(), 0.0f);
  }
  std::vector<std::span<const float>> initial(c.initial.begin(), c.initial.end());
  EXPECT_TRUE(c.client->Init(initial).ok());
  return c;
}

absl::StatusOr<std::unique_ptr<StepExchange>> Begin(Connected& c, Mode mode) {
  std::vector<std::span<const float>> gradients(c.gradients.begin(), c.gradients.end());
  std::vector<std::span<float>> out(c.out.begin(), c.out.end());
  const int64_t min_version = mode == SYNC ? 1 : 0;
  return c.client->BeginExchange({.computed_at = {0, 0},
                                  .gradients = gradients,
                                  .min_versions = {min_version, min_version},
                                  .timeout = absl::Seconds(10),
                                  .values = out},
                                 kPushOrder);
}

class StepExchangeTest : public ::testing::TestWithParam<Mode> {};

TEST_P(StepExchangeTest, AWholeExchangeCommitsOneUpdateAndBringsItBack) {
  Connected c = Connect(GetParam());
  absl::StatusOr<std::unique_ptr<StepExchange>> exchange = Begin(c, GetParam());
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  for (size_t i = 0; i < kPushOrder.size(); i += 2) {
    ASSERT_TRUE((*exchange)->Push(std::span<const int>(kPushOrder).subspan(i, 2)).ok());
  }
  for (int v = 0; v < static_cast<int>(kModel.size()); ++v) {
    ASSERT_TRUE((*exchange)->AwaitValues(v).ok()) << v;
    for (float value : c.out[v]) ASSERT_FLOAT_EQ(value, 1.0f - 0.5f * 2.0f) << kModel[v].name;
  }
  std::vector<int64_t> versions;
  std::vector<PushResponse> responses;
  ASSERT_TRUE((*exchange)->Finish(&versions, &responses).ok());
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(responses[0].outcome(), PushResponse::APPLIED);
}

// A push has gone out when Push returns: between pushes (while backward
// computes) and after the last (until the next forward pass waits for
// values) nothing else drives the worker's calls.
TEST_P(StepExchangeTest, APushHasLeftWhenPushReturns) {
  Connected c = Connect(GetParam(), kLargeModel);
  absl::StatusOr<std::unique_ptr<StepExchange>> exchange = Begin(c, GetParam());
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  for (size_t i = 0; i < kPushOrder.size(); i += 2) {
    ASSERT_TRUE((*exchange)->Push(std::span<const int>(kPushOrder).subspan(i, 2)).ok());
  }
  for (int s = 0; s < 2; ++s) {
    EXPECT_TRUE(Eventually([&] {
      absl::StatusOr<StatsResponse> stats = c.client->Stats(s);  // not on the exchange's queue
      return stats.ok() && stats->version() == 1;
    })) << "shard " << s << " never had the whole push";
  }
  for (int v = 0; v < static_cast<int>(kLargeModel.size()); ++v) {
    ASSERT_TRUE((*exchange)->AwaitValues(v).ok()) << v;
  }
  std::vector<int64_t> versions;
  std::vector<PushResponse> responses;
  ASSERT_TRUE((*exchange)->Finish(&versions, &responses).ok());
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 1}));
}

TEST_P(StepExchangeTest, PushingOutOfOrderIsRefused) {
  Connected c = Connect(GetParam());
  absl::StatusOr<std::unique_ptr<StepExchange>> exchange = Begin(c, GetParam());
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  const int first_layer[] = {0, 1};
  EXPECT_EQ((*exchange)->Push(first_layer).code(), absl::StatusCode::kInternal);
}

TEST_P(StepExchangeTest, AnExchangeAbandonedBetweenLayersChangesNothing) {
  Connected c = Connect(GetParam());
  {
    absl::StatusOr<std::unique_ptr<StepExchange>> exchange = Begin(c, GetParam());
    ASSERT_TRUE(exchange.ok()) << exchange.status();
    // The last layer goes out; the worker dies before the first layer's.
    ASSERT_TRUE((*exchange)->Push(std::span<const int>(kPushOrder).first(2)).ok());
  }  // destroyed unfinished: the calls are cancelled
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<StatsResponse> stats = c.client->Stats(s);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version(), 0) << "shard " << s;
    EXPECT_EQ(stats->pushes_applied() + stats->pushes_aggregated(), 0) << "shard " << s;
  }
  std::vector<std::span<float>> out(c.out.begin(), c.out.end());
  std::vector<int64_t> versions;
  ASSERT_TRUE(c.client
                  ->Exchange({.min_versions = {0, 0}, .timeout = absl::Seconds(5), .values = out},
                             &versions, nullptr)
                  .ok());
  for (size_t v = 0; v < kModel.size(); ++v) {
    for (float value : c.out[v]) ASSERT_EQ(value, 1.0f) << kModel[v].name;
  }
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, StepExchangeTest, ::testing::Values(SYNC, ASYNC),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return std::string(Mode_Name(info.param));
                         });

}  // namespace PST_FILE_ID
}  // namespace pst
