// The model a shard takes at its first Init: the config's model when the
// config names one, whatever the first Init carries when the workers bring
// their own.
#include "ps_server/core/model_share.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/embedding_config.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/placement.h"
#include "ps_server/core/parameter_shard.h"

namespace pst {
namespace PST_FILE_ID {

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

// 2 workers training configs/ctr.textproto's model, smaller: 26 fields of
// dim 8 and 13 dense features into 16 -> 1, and a wide table, over
// `shards` shards. The wide table's row limit keeps the tables apart
// (CtrShardTables, common/ctr_config.h) unless `joint`.
JobConfig CtrJob(int shards, bool joint = false) {
  std::string cluster = "cluster { workers: 2";
  for (int s = 0; s < shards; ++s) {
    cluster += " ps: \"127.0.0.1:" + std::to_string(5000 + s) + "\"";
  }
  absl::StatusOr<JobConfig> config =
      ParseConfig(cluster +
                      " } training { optimizer { adagrad { learning_rate: 0.1 } } "
                      "model { ctr { table: \"categorical\" wide_table: \"wide\" hidden: 16 } "
                      "embeddings { name: \"categorical\" dim: 8 init_scale: 0.05 } "
                      "embeddings { name: \"wide\" dim: 1 init_scale: 0 " +
                      std::string(joint ? "" : "max_rows_per_shard: 1000000 ") +
                      "} } "
                      "dataset { ctr { train_file: \"t.tsv\" test_file: \"e.tsv\" } } }",
                  "test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyDefaults(&*config);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
  return *config;
}

// What the CTR worker of CtrJob declares at Init (worker/training/ctr_trainer.cc):
// its MLP, 26 * 8 + 13 -> `hidden` -> 1, and both tables resolved.
ConfigModel CtrWorkersModel(const JobConfig& config, int64_t hidden = 16) {
  ConfigModel model;
  model.variables = {{"dense_0/kernel", {26 * 8 + 13, hidden}},
                     {"dense_0/bias", {hidden}},
                     {"dense_1/kernel", {hidden, 1}},
                     {"dense_1/bias", {1}}};
  absl::StatusOr<std::vector<EmbeddingTableConfig>> tables =
      ResolveEmbeddingTables(config.training().model().embeddings(), config.training().optimizer());
  EXPECT_TRUE(tables.ok()) << tables.status();
  model.embeddings = *tables;
  return model;
}

// An Init from `worker` carrying `variables`, each filled with zeros, and
// declaring `tables`.
InitRequest InitOf(int worker, const std::vector<VariableSpec>& variables,
                   const std::vector<EmbeddingTableConfig>& tables = {}) {
  InitRequest init;
  init.set_worker(worker);
  for (const VariableSpec& v : variables) {
    std::vector<float> zeros(static_cast<size_t>(v.size()), 0.0f);
    EncodeTensor(v.name, v.shape, zeros, init.add_variables());
  }
  init.mutable_embeddings()->Assign(tables.begin(), tables.end());
  return init;
}

InitRequest InitOf(int worker, const ConfigModel& model) {
  return InitOf(worker, model.variables, model.embeddings);
}

std::unique_ptr<ParameterShard> ShardOf(const JobConfig& config, int shard) {
  absl::StatusOr<std::unique_ptr<ParameterShard>> created =
      ParameterShard::Create(ShardOptionsFromConfig(config, shard));
  EXPECT_TRUE(created.ok()) << created.status();
  return std::move(*created);
}

TEST(ModelShareTest, TheConfigsMlpIsTheWorkersVariables) {
  std::optional<ConfigModel> config_model = ConfigModelOf(QuadraticJob(1));
  ASSERT_TRUE(config_model.has_value());
  EXPECT_TRUE(config_model->embeddings.empty());
  const std::vector<VariableSpec>* model = &config_model->variables;
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
  EXPECT_FALSE(ConfigModelOf(QuadraticJob(1, "worker_command: \"python3 train.py\""))
                   .has_value());
}

// The service refuses unparsed an Init larger than this: the workers' own
// Init of each share, float32 and with embedding tables, must never be.
TEST(ModelShareTest, EveryShareInitFitsItsBound) {
  JobConfig config = QuadraticJob(3);
  config.mutable_training()->mutable_model()->mutable_mlp()->set_hidden(0, 20000);
  ConfigModel model = *ConfigModelOf(config);
  for (int t = 0; t < 8; ++t) {
    EmbeddingTableConfig& table = model.embeddings.emplace_back();
    table.set_name("a table with a long name, " + std::to_string(t));
    table.set_dim(64);
    table.mutable_optimizer()->mutable_adam()->set_learning_rate(0.001f);
  }
  for (int s = 0; s < 3; ++s) {
    const ConfigModel share = ShardShare(model, s, 3);
    const InitRequest init = InitOf(1, share);
    EXPECT_LE(static_cast<int64_t>(init.ByteSizeLong()), MaxShareInitBytes(share)) << s;
    // And no more than 64 KiB and some framing above the share's own bytes.
    EXPECT_LE(MaxShareInitBytes(share),
              static_cast<int64_t>(init.ByteSizeLong()) + 64 * 1024 +
                  64 * static_cast<int64_t>(share.variables.size() + share.embeddings.size()))
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
  std::vector<VariableSpec> wider = ConfigModelOf(config)->variables;
  wider[2].shape = {5, 1};
  EXPECT_THAT(shard->Init(InitOf(1, wider), &response).message(),
              HasSubstr("variable 2 is \"dense_1/kernel\" [5, 1]"));
  std::vector<VariableSpec> fewer = ConfigModelOf(config)->variables;
  fewer.pop_back();
  EXPECT_THAT(shard->Init(InitOf(1, fewer), &response).message(),
              HasSubstr("it carries 3 variables, the share is 4"));
  // Still waiting for its model: the workers' own Init is taken.
  ASSERT_TRUE(shard->Init(InitOf(0, ConfigModelOf(config)->variables), &response).ok());
  EXPECT_TRUE(response.accepted());
}

TEST(InitPoisoningTest, EachShardTakesItsOwnShareOnly) {
  // Wide enough that placement cuts the first kernel into one slice per shard.
  JobConfig config = QuadraticJob(2);
  config.mutable_training()->mutable_model()->mutable_mlp()->set_hidden(0, 20000);
  const std::vector<VariableSpec> model = ConfigModelOf(config)->variables;
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

TEST(ModelShareTest, TheConfigsCtrModelIsItsMlpAndEveryTableResolved) {
  const JobConfig config = CtrJob(1);
  std::optional<ConfigModel> model = ConfigModelOf(config);
  ASSERT_TRUE(model.has_value());
  const std::vector<VariableSpec> mlp = CtrWorkersModel(config).variables;
  ASSERT_EQ(model->variables.size(), mlp.size());
  for (size_t i = 0; i < mlp.size(); ++i) {
    EXPECT_EQ(model->variables[i].name, mlp[i].name);
    EXPECT_EQ(model->variables[i].shape, mlp[i].shape) << mlp[i].name;
  }
  // As the worker declares them: defaults filled in, the job's optimizer
  // where a table names none.
  ASSERT_EQ(model->embeddings.size(), 2u);
  EXPECT_EQ(model->embeddings[0].name(), "categorical");
  EXPECT_EQ(model->embeddings[0].dim(), 8);
  EXPECT_EQ(model->embeddings[0].max_rows_per_shard(), kDefaultMaxRowsPerShard);
  EXPECT_TRUE(model->embeddings[0].optimizer().has_adagrad());
  EXPECT_EQ(model->embeddings[1].name(), "wide");
  EXPECT_FLOAT_EQ(model->embeddings[1].init_scale(), 0.0f);
  EXPECT_FALSE(ConfigModelOf([&] {
                 JobConfig own = config;
                 own.mutable_cluster()->set_worker_command("python3 train.py");
                 return own;
               }())
                   .has_value());
}

// Tables trained alike are one table of parts on the shards: a shard
// expects that table, and refuses an Init declaring the two apart.
TEST(ModelShareTest, TheCtrTablesTrainedAlikeAreOneTableOfParts) {
  const JobConfig config = CtrJob(1, /*joint=*/true);
  std::optional<ConfigModel> model = ConfigModelOf(config);
  ASSERT_TRUE(model.has_value());
  ASSERT_EQ(model->embeddings.size(), 1u);
  EXPECT_EQ(model->embeddings[0].name(), "categorical+wide");
  EXPECT_EQ(model->embeddings[0].dim(), 9);
  ASSERT_EQ(model->embeddings[0].parts_size(), 2);
  EXPECT_FLOAT_EQ(model->embeddings[0].parts(1).init_scale(), 0.0f);
  // The MLP's input is still the deep table's 26 x 8 pooled columns.
  EXPECT_EQ(model->variables[0].shape, (std::vector<int64_t>{26 * 8 + 13, 16}));

  std::unique_ptr<ParameterShard> shard = ShardOf(config, 0);
  InitResponse response;
  ConfigModel apart = CtrWorkersModel(config);
  EXPECT_THAT(shard->Init(InitOf(1, apart), &response).message(),
              HasSubstr("embedding table 0 is \"categorical\" of dim 8 where the model has "
                        "\"categorical+wide\" of dim 9"));
  EXPECT_TRUE(shard->Init(InitOf(1, *model), &response).ok());
}

// A first Init that would give a CTR job's shard other dense variables, no
// tables, tables of other shapes, or tables that train otherwise (a huge
// learning rate, another row limit or initial scale) is refused; the
// workers' own Init is taken after.
TEST(InitPoisoningTest, AShardOfACtrJobRefusesAFirstInitThatIsNotItsShare) {
  const JobConfig config = CtrJob(1);
  const ConfigModel model = CtrWorkersModel(config);
  std::unique_ptr<ParameterShard> shard = ShardOf(config, 0);
  InitResponse response;
  struct Case {
    std::string what;
    std::function<void(ConfigModel*)> poison;
    std::string refusal;
  };
  const Case cases[] = {
      {"another MLP", [](ConfigModel* m) { m->variables[0].shape = {4, 16}; },
       "variable 0 is \"dense_0/kernel\" [4, 16] where the model has \"dense_0/kernel\" "
       "[221, 16]"},
      {"no tables", [](ConfigModel* m) { m->embeddings.clear(); },
       "it declares 0 embedding tables, the model has 2"},
      {"a table more",
       [](ConfigModel* m) {
         m->embeddings.push_back(m->embeddings[1]);
         m->embeddings.back().set_name("extra");
       },
       "it declares 3 embedding tables, the model has 2"},
      {"a wider table", [](ConfigModel* m) { m->embeddings[0].set_dim(64); },
       "embedding table 0 is \"categorical\" of dim 64 where the model has \"categorical\" of "
       "dim 8"},
      {"tables swapped", [](ConfigModel* m) { std::swap(m->embeddings[0], m->embeddings[1]); },
       "embedding table 0 is \"wide\" of dim 1 where the model has \"categorical\" of dim 8"},
      {"a huge learning rate",
       [](ConfigModel* m) {
         m->embeddings[1].mutable_optimizer()->mutable_sgd()->set_learning_rate(1e6f);
       },
       "embedding table \"wide\" has another optimizer"},
      {"another optimizer in one table",
       [](ConfigModel* m) {
         m->embeddings[0].mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
       },
       "embedding table \"categorical\" has another optimizer"},
      {"another row limit", [](ConfigModel* m) { m->embeddings[0].set_max_rows_per_shard(1); },
       "embedding table \"categorical\" has max_rows_per_shard 1 where the config has 4194304"},
      {"another initial scale", [](ConfigModel* m) { m->embeddings[1].set_init_scale(100.0f); },
       "embedding table \"wide\" has init_scale 100 where the config has 0"},
      {"a bad table", [](ConfigModel* m) { m->embeddings[0].set_dim(0); }, "categorical"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ConfigModel poisoned = model;
    c.poison(&poisoned);
    absl::Status refused = shard->Init(InitOf(1, poisoned), &response);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(refused.message(),
                HasSubstr("an Init from worker:1 does not carry shard 0's share of the config's "
                          "model (training.model): "));
    EXPECT_THAT(refused.message(), HasSubstr(c.refusal));
  }
  // A table left without an optimizer trains with the job's, as the
  // config's does: the same table.
  ConfigModel unresolved = model;
  unresolved.embeddings[1].clear_optimizer();
  ASSERT_TRUE(shard->Init(InitOf(0, unresolved), &response).ok());
  EXPECT_TRUE(response.accepted());
}

TEST(InitPoisoningTest, EachShardOfACtrJobTakesItsDenseShareAndEveryTable) {
  JobConfig config = CtrJob(2);
  // Wide enough that placement cuts the first kernel into one slice per shard.
  config.mutable_training()->mutable_model()->mutable_ctr()->set_hidden(0, 4000);
  const ConfigModel model = CtrWorkersModel(config, 4000);
  const std::vector<VariableSpec> shares[2] = {ShardShare(model.variables, 0, 2),
                                               ShardShare(model.variables, 1, 2)};
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(absl::StrCat("shard ", s));
    ASSERT_FALSE(shares[s].empty());
    EXPECT_EQ(ShardShare(model, s, 2).embeddings.size(), 2u);
    std::unique_ptr<ParameterShard> shard = ShardOf(config, s);
    InitResponse response;
    EXPECT_FALSE(shard->Init(InitOf(0, shares[1 - s], model.embeddings), &response).ok());
    EXPECT_FALSE(shard->Init(InitOf(0, shares[s]), &response).ok());
    ASSERT_TRUE(shard->Init(InitOf(0, shares[s], model.embeddings), &response).ok());
    EXPECT_TRUE(response.accepted());
  }
}

// The shipped MLP worker declares no table: an Init of the config's MLP
// with a table beside it is not the workers'.
TEST(InitPoisoningTest, AnMlpJobsShardRefusesTablesBesideItsModel) {
  const JobConfig config = QuadraticJob(1);
  std::unique_ptr<ParameterShard> shard = ShardOf(config, 0);
  EmbeddingTableConfig table;
  table.set_name("extra");
  table.set_dim(4);
  InitResponse response;
  absl::Status refused =
      shard->Init(InitOf(1, ConfigModelOf(config)->variables, {table}), &response);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("it declares 1 embedding tables, the model has 0"));
}

}  // namespace PST_FILE_ID
}  // namespace pst
