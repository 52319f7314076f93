// An exchange of which one shard's part fails ends with that shard's error
// at once: the other shards' parts are cancelled, not awaited. In SYNC a
// read waits for the step every worker's push completes; the other workers
// may be waiting on this one at the failed shard (restarted from its
// checkpoint, it waits for this worker's push of its step), so awaiting the
// read would hold every worker until its timeout. Both the whole exchange
// (PsClient::Exchange) and the layer-wise one (BeginExchange), against real
// shards of which one stops mid-exchange.
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/eventually.h"
#include "worker/client/ps_client.h"
#include "worker/client/step_exchange.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

// Two variables: one on each shard.
const std::vector<VariableSpec> kModel = {{"w", {8, 4}}, {"b", {32}}};
const std::vector<int> kPushOrder = {1, 0};
// Far longer than the test waits: an exchange that awaited the read would
// still be waiting when the test gives up on it.
constexpr absl::Duration kReadTimeout = absl::Seconds(120);
constexpr absl::Duration kGiveUp = absl::Seconds(60);

JobConfig SyncConfig() {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(2);
  // The test's client brings its own variables (kModel).
  config.mutable_cluster()->set_worker_command("exchange_failure_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(SYNC);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.5f);
  t->mutable_model()->mutable_mlp()->add_hidden(8);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

class ExchangeFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
        InProcessCluster::Start(SyncConfig(), /*num_shards=*/2);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
    const auto& ps = cluster_->config().cluster().ps();
    absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(
        std::vector<std::string>(ps.begin(), ps.end()), /*worker=*/0, absl::Seconds(10));
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    client_->SetVariables(kModel);
    ASSERT_TRUE(client_->Register().ok());
    for (const VariableSpec& v : kModel) {
      initial_.emplace_back(v.size(), 1.0f);
      gradients_.emplace_back(v.size(), 2.0f);
      out_.emplace_back(v.size(), 0.0f);
    }
    // Init refuses a model that leaves a shard without a variable.
    ASSERT_TRUE(client_->Init({initial_.begin(), initial_.end()}).ok());
  }

  // Waits until both shards hold worker 0's push and wait with its read
  // for worker 1 (who never pushes), then stops shard 0.
  void StopShardZeroOnceBothReadsWait() {
    ASSERT_TRUE(Eventually([&] {
      return cluster_->shard(0).waiting_pulls() == 1 && cluster_->shard(1).waiting_pulls() == 1;
    })) << "the reads never waited";
    cluster_->StopShard(0);
  }

  void ExpectEndedByShardZeroAlone(std::future<absl::Status>& exchange) {
    const bool ended =
        exchange.wait_for(absl::ToChronoSeconds(kGiveUp)) == std::future_status::ready;
    if (!ended) {
      cluster_->StopShard(1);  // lets the exchange end, for the test to
      exchange.wait();
    }
    ASSERT_TRUE(ended) << "the exchange awaited shard 1's read after shard 0 failed";
    const absl::Status status = exchange.get();
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(std::string(status.message()), HasSubstr("ps:0"));
    // Shard 1's step is still incomplete: the exchange did not wait for it.
    EXPECT_EQ(cluster_->shard(1).version(), 0);
  }

  std::unique_ptr<InProcessCluster> cluster_;
  std::unique_ptr<PsClient> client_;
  std::vector<std::vector<float>> initial_, gradients_, out_;
};

TEST_F(ExchangeFailureTest, AWholeExchangeEndsWithTheFailedShardAlone) {
  std::future<absl::Status> exchange = std::async(std::launch::async, [&] {
    std::vector<int64_t> versions;
    return client_->Exchange({.computed_at = {0, 0},
                              .gradients = {gradients_.begin(), gradients_.end()},
                              .min_versions = {1, 1},
                              .timeout = kReadTimeout,
                              .values = {out_.begin(), out_.end()}},
                             &versions, nullptr);
  });
  StopShardZeroOnceBothReadsWait();
  ExpectEndedByShardZeroAlone(exchange);
}

TEST_F(ExchangeFailureTest, ALayerwiseExchangeEndsWithTheFailedShardAlone) {
  std::future<absl::Status> exchange = std::async(std::launch::async, [&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<StepExchange>> begun =
        client_->BeginExchange({.computed_at = {0, 0},
                                .gradients = {gradients_.begin(), gradients_.end()},
                                .min_versions = {1, 1},
                                .timeout = kReadTimeout,
                                .values = {out_.begin(), out_.end()}},
                               kPushOrder);
    if (!begun.ok()) return begun.status();
    if (absl::Status pushed = (*begun)->Push(kPushOrder); !pushed.ok()) return pushed;
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    return (*begun)->Finish(&versions, &responses);
  });
  StopShardZeroOnceBothReadsWait();
  ExpectEndedByShardZeroAlone(exchange);
}

}  // namespace PST_FILE_ID
}  // namespace pst
