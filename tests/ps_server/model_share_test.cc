// The model a shard takes at its first Init: the config's model when the
// config names one, whatever the first Init carries when the workers bring
// their own.
#include "ps_server/model_share.h"

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/placement.h"
#include "ps_server/parameter_shard.h"

namespace pst {
namespace {

using ::testing::HasSubstr;

// 2 workers training a 3 -> 4 -> 1 MLP on the quadratic data set over
// `shards` shards.
JobConfig QuadraticJob(int shards, const std::string& cluster_extra = "") {
  std::string cluster = "cluster { workers: 2 " + cluster_extra;
  for (int s = 0; s < shards; ++s) {
    cluster += " ps: \"127.0.0.1:" + std::to_string(5000 + s) + "\"";
  }
  absl::StatusOr<JobConfig> config = ParseConfig(
      cluster + " } training { optimizer { sgd { learning_rate: 0.1 } } "
                "model { mlp { hidden: 4 } } dataset { quadratic { examples: 16 } } }",
      "test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyDefaults(&*config);
  return *config;
}

// An Init from `worker` carrying `variables`, each filled with zeros.
InitRequest InitOf(int worker, const std::vector<VariableSpec>& variables) {
  InitRequest init;
  init.set_worker(worker);
  for (const VariableSpec& v : variables) {
    std::vector<float> zeros(static_cast<size_t>(v.size()), 0.0f);
    EncodeTensor(v.name, v.shape, zeros, init.add_variables());
  }
  return init;
}

std::unique_ptr<ParameterShard> ShardOf(const JobConfig& config, int shard) {
  absl::StatusOr<std::unique_ptr<ParameterShard>> created =
      ParameterShard::Create(ShardOptionsFromConfig(config, shard));
  EXPECT_TRUE(created.ok()) << created.status();
  return std::move(*created);
}

TEST(ModelShareTest, TheConfigsMlpIsTheWorkersVariables) {
  std::optional<std::vector<VariableSpec>> model = ConfigModelVariables(QuadraticJob(1));
  ASSERT_TRUE(model.has_value());
  ASSERT_EQ(model->size(), 4u);
  EXPECT_EQ((*model)[0].name, "dense_0/kernel");
  EXPECT_EQ((*model)[0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ((*model)[1].name, "dense_0/bias");
  EXPECT_EQ((*model)[1].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ((*model)[2].name, "dense_1/kernel");
  EXPECT_EQ((*model)[2].shape, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ((*model)[3].name, "dense_1/bias");
}

TEST(ModelShareTest, AWorkerCommandBringsItsOwnModel) {
  EXPECT_FALSE(ConfigModelVariables(QuadraticJob(1, "worker_command: \"python3 train.py\""))
                   .has_value());
}

// The service refuses unparsed an Init larger than this: the workers' own
// Init of each share, float32 and with embedding tables, must never be.
TEST(ModelShareTest, EveryShareInitFitsItsBound) {
  JobConfig config = QuadraticJob(3);
  config.mutable_training()->mutable_model()->mutable_mlp()->set_hidden(0, 20000);
  const std::vector<VariableSpec> model = *ConfigModelVariables(config);
  for (int s = 0; s < 3; ++s) {
    const std::vector<VariableSpec> share = ShardShare(model, s, 3);
    InitRequest init = InitOf(1, share);
    for (int t = 0; t < 8; ++t) {
      EmbeddingTableConfig* table = init.add_embeddings();
      table->set_name("a table with a long name, " + std::to_string(t));
      table->set_dim(64);
      table->mutable_optimizer()->mutable_adam()->set_learning_rate(0.001f);
    }
    EXPECT_LE(static_cast<int64_t>(init.ByteSizeLong()), MaxShareInitBytes(share)) << s;
    // And no more than 64 KiB and some framing above the share's own bytes.
    EXPECT_LE(MaxShareInitBytes(share), static_cast<int64_t>(InitOf(1, share).ByteSizeLong()) +
                                            64 * 1024 + 64 * static_cast<int64_t>(share.size()))
        << s;
  }
}

TEST(InitPoisoningTest, AShardRefusesAFirstInitThatIsNotTheConfigsModel) {
  const JobConfig config = QuadraticJob(1);
  std::unique_ptr<ParameterShard> shard = ShardOf(config, 0);
  InitResponse response;
  absl::Status poisoned = shard->Init(InitOf(1, {{"w", {1}}}), &response);
  EXPECT_EQ(poisoned.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(poisoned.message(),
              HasSubstr("an Init from worker:1 does not carry shard 0's share of the config's "
                        "model (training.model): variable 0 is \"w\" [1] where the model has "
                        "\"dense_0/kernel\" [3, 4]"));
  // The same names with another shape, and a share with one variable missing.
  std::vector<VariableSpec> wider = *ConfigModelVariables(config);
  wider[2].shape = {5, 1};
  EXPECT_THAT(shard->Init(InitOf(1, wider), &response).message(),
              HasSubstr("variable 2 is \"dense_1/kernel\" [5, 1]"));
  std::vector<VariableSpec> fewer = *ConfigModelVariables(config);
  fewer.pop_back();
  EXPECT_THAT(shard->Init(InitOf(1, fewer), &response).message(),
              HasSubstr("it carries 3 variables, the share is 4"));
  // Still waiting for its model: the workers' own Init is taken.
  ASSERT_TRUE(shard->Init(InitOf(0, *ConfigModelVariables(config)), &response).ok());
  EXPECT_TRUE(response.accepted());
}

TEST(InitPoisoningTest, EachShardTakesItsOwnShareOnly) {
  // Wide enough that placement cuts the first kernel into one slice per shard.
  JobConfig config = QuadraticJob(2);
  config.mutable_training()->mutable_model()->mutable_mlp()->set_hidden(0, 20000);
  const std::vector<VariableSpec> model = *ConfigModelVariables(config);
  std::vector<VariableSpec> shares[2] = {ShardShare(model, 0, 2), ShardShare(model, 1, 2)};
  ASSERT_FALSE(shares[0].empty());
  ASSERT_FALSE(shares[1].empty());
  for (int s = 0; s < 2; ++s) {
    std::unique_ptr<ParameterShard> shard = ShardOf(config, s);
    InitResponse response;
    EXPECT_FALSE(shard->Init(InitOf(0, shares[1 - s]), &response).ok()) << "shard " << s;
    ASSERT_TRUE(shard->Init(InitOf(0, shares[s]), &response).ok()) << "shard " << s;
    EXPECT_TRUE(response.accepted());
  }
}

TEST(InitPoisoningTest, WithoutAModelInTheConfigTheFirstInitWins) {
  std::unique_ptr<ParameterShard> shard =
      ShardOf(QuadraticJob(1, "worker_command: \"python3 train.py\""), 0);
  InitResponse response;
  ASSERT_TRUE(shard->Init(InitOf(1, {{"w", {1}}}), &response).ok());
  EXPECT_TRUE(response.accepted());
}

}  // namespace
}  // namespace pst
