// The CTR trainer against real shards on loopback (workers as threads, each
// with its own client): SYNC with N workers trains the model one worker
// trains on the combined batch, dense variables and embedding rows alike;
// and the shards, which check a first Init against the config's model,
// expect the model the trainer declares.
#include "worker/training/ctr_trainer.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "common/ctr_config.h"
#include "common/status_macros.h"
#include "data/ctr_formats.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "ps_server/core/model_share.h"
#include "tests/support/commands.h"
#include "worker/training/ctr_data.h"

namespace pst {
namespace PST_FILE_ID {

// 20 steps of a combined batch of 32.
constexpr int kCombinedBatch = 32;
constexpr int kSteps = 20;

// The CTR model of configs/ctr.textproto, smaller, with every field's ids
// few enough that most rows are touched by several workers in one step.
JobConfig CtrConfig(const std::string& dir, int workers, const std::string& optimizer,
                    const std::string& pooling) {
  absl::StatusOr<JobConfig> config = ParseConfig(
      absl::StrCat(
          "cluster { ps: \"127.0.0.1:1\" workers: ", workers, " } ",
          "training { mode: SYNC batch_size: ", kCombinedBatch / workers,
          " epochs: 1 seed: 3 log_every_steps: 1000000 pull_timeout_seconds: 60 ",
          "optimizer { ", optimizer, " } ",
          "model { ctr { table: \"categorical\" wide_table: \"wide\" hidden: 16 pooling: ",
          pooling, " } embeddings { name: \"categorical\" dim: 4 init_scale: 0.05 } ",
          "embeddings { name: \"wide\" dim: 1 init_scale: 0 } } ",
          "dataset { ctr { train_file: \"", dir, "/train.tsv\" test_file: \"", dir,
          "/test.tsv\" format: CRITEO } } }"),
      "ctr_trainer_test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyDefaults(&*config);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
  return *config;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// What a run leaves on the shards: the dense variables in model order, and
// each table's rows of `ids`.
struct TrainedModel {
  std::vector<std::vector<float>> dense;
  std::vector<float> categorical;
  std::vector<float> wide;
  std::vector<StatsResponse> stats;
  int64_t steps = 0;
};

absl::StatusOr<TrainedModel> Train(const JobConfig& job, int shards,
                                   const std::vector<uint64_t>& ids) {
  PST_ASSIGN_OR_RETURN(std::unique_ptr<InProcessCluster> cluster,
                       InProcessCluster::Start(job, shards));
  const JobConfig& config = cluster->config();
  const int workers = config.cluster().workers();
  const std::vector<std::string> addresses(config.cluster().ps().begin(),
                                           config.cluster().ps().end());
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int rank = 0; rank < workers; ++rank) {
    PST_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                         PsClient::Connect(addresses, rank, absl::Seconds(10)));
    clients.push_back(std::move(client));
  }
  std::vector<absl::StatusOr<WorkerResult>> results(workers, absl::UnknownError("not run"));
  std::vector<std::unique_ptr<Kernels>> kernels;
  for (int rank = 0; rank < workers; ++rank) kernels.push_back(MakeCpuKernels());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      CtrTrainer trainer(config, rank, clients[rank].get(), kernels[rank].get(), std::nullopt);
      results[rank] = trainer.Run();
    });
  }
  for (std::thread& thread : threads) thread.join();
  TrainedModel model;
  for (int rank = 0; rank < workers; ++rank) {
    if (!results[rank].ok()) return results[rank].status();
    model.steps += results[rank]->steps();
  }

  // The chief's client knows the model's variables and tables.
  PsClient& client = *clients[0];
  std::unique_ptr<Kernels> host = MakeCpuKernels();
  PST_ASSIGN_OR_RETURN(std::unique_ptr<CtrModel> shape,
                       CtrModel::Create(CtrModelSpecFor(config.training()), host.get(), 1));
  for (const VariableSpec& v : shape->mlp().variables()) model.dense.emplace_back(v.size(), NAN);
  std::vector<std::span<float>> dense(model.dense.begin(), model.dense.end());
  const size_t categorical_dim = config.training().model().embeddings(0).dim();
  model.categorical.assign(ids.size() * categorical_dim, NAN);
  model.wide.assign(ids.size(), NAN);
  // Joint tables (CtrShardTables) are read whole and split.
  PST_ASSIGN_OR_RETURN(CtrTables tables, CtrShardTables(config.training()));
  std::vector<float> joint(tables.joint ? ids.size() * (categorical_dim + 1) : 0, NAN);
  std::vector<RowValues> rows;
  if (tables.joint) {
    rows.push_back({client.FindEmbeddingTable(tables.deep), ids, joint});
  } else {
    rows.push_back({client.FindEmbeddingTable("categorical"), ids, model.categorical});
    rows.push_back({client.FindEmbeddingTable("wide"), ids, model.wide});
  }
  std::vector<int64_t> versions;
  const std::vector<int64_t> any_version(client.num_shards(), 0);
  PST_RETURN_IF_ERROR(
      client.Exchange({.min_versions = any_version, .timeout = absl::Seconds(10), .values = dense},
                      &versions, nullptr));
  PST_RETURN_IF_ERROR(client.Exchange(
      {.min_versions = any_version, .timeout = absl::Seconds(10), .pull_rows = rows}, &versions,
      nullptr));
  for (size_t i = 0; i < joint.size() / (categorical_dim + 1); ++i) {
    const float* row = &joint[i * (categorical_dim + 1)];
    std::copy_n(row, categorical_dim, &model.categorical[i * categorical_dim]);
    model.wide[i] = row[categorical_dim];
  }
  for (int s = 0; s < client.num_shards(); ++s) {
    PST_ASSIGN_OR_RETURN(StatsResponse stats, client.Stats(s));
    model.stats.push_back(std::move(stats));
  }
  return model;
}

class CtrSyncEquivalenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(ScratchDir(), "/ctr_trainer_test");
    std::filesystem::create_directories(dir_);
    CtrGeneratorOptions options;
    options.train_examples = kCombinedBatch * kSteps;
    options.test_examples = 64;
    options.distinct = {40};
    options.seed = 5;
    absl::StatusOr<PlantedModel> planted =
        GenerateCtrFiles(options, dir_ + "/train.tsv", dir_ + "/test.tsv");
    ASSERT_TRUE(planted.ok()) << planted.status();
    // Every id of the training file: the rows any run may have trained.
    absl::StatusOr<std::unique_ptr<CtrReader>> reader =
        CtrReader::Open(dir_ + "/train.tsv", CtrReaderOptions{});
    ASSERT_TRUE(reader.ok()) << reader.status();
    CtrBatch batch = EmptyBatchFor(CtrFormat::kCriteo);
    ASSERT_TRUE((*reader)->Read(kCombinedBatch * kSteps, &batch).ok());
    absl::flat_hash_set<uint64_t> seen;
    for (uint64_t id : batch.ids) {
      if (seen.insert(id).second) ids_.push_back(id);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::vector<uint64_t> ids_;
};

// Each worker's loss is the mean over its batch, so its gradients are
// (1/b) sum of its examples' gradients; the shard applies the mean over
// the N workers of the dense gradients and, per id, the sum of the
// workers' row gradients divided by N. Both are (1/(N b)) sum over the
// combined batch: what one worker with batch N*b computes, and line i goes
// to worker i % N, so the N batches of step s are exactly the single
// worker's batch of step s. Only the order of the float sums differs.
TEST_F(CtrSyncEquivalenceTest, NWorkersTrainTheModelOfOneWorkerWithTheCombinedBatch) {
  struct Case {
    std::string optimizer;
    std::string pooling;
  };
  for (const Case& c : {Case{"adagrad { learning_rate: 0.1 initial_accumulator: 0.0001 }",
                             "POOLING_SUM"},
                        Case{"sgd { learning_rate: 0.2 momentum: 0.9 }", "POOLING_MEAN"}}) {
    SCOPED_TRACE(c.optimizer);
    absl::StatusOr<TrainedModel> single =
        Train(CtrConfig(dir_, 1, c.optimizer, c.pooling), 1, ids_);
    ASSERT_TRUE(single.ok()) << single.status();
    ASSERT_EQ(single->steps, kSteps);
    ASSERT_EQ(single->stats[0].version(), kSteps);
    // The wide rows start at zero: what is compared has trained.
    EXPECT_GT(RelativeError(single->wide, std::vector<float>(ids_.size(), 0.0f)), 0.0);
    struct Layout {
      int workers, shards;
      SharedMemory shm;
    };
    for (Layout layout : {Layout{2, 1, SHM_AUTO}, Layout{2, 2, SHM_OFF}, Layout{4, 1, SHM_AUTO},
                          Layout{4, 3, SHM_OFF}}) {
      SCOPED_TRACE(absl::StrCat(layout.workers, " workers, ", layout.shards, " shards, ",
                                SharedMemory_Name(layout.shm)));
      JobConfig config = CtrConfig(dir_, layout.workers, c.optimizer, c.pooling);
      config.mutable_cluster()->set_shm(layout.shm);
      absl::StatusOr<TrainedModel> multi = Train(config, layout.shards, ids_);
      ASSERT_TRUE(multi.ok()) << multi.status();
      EXPECT_EQ(multi->steps, layout.workers * kSteps);
      for (const StatsResponse& shard : multi->stats) EXPECT_EQ(shard.version(), kSteps);
      ASSERT_EQ(multi->dense.size(), single->dense.size());
      for (size_t v = 0; v < single->dense.size(); ++v) {
        EXPECT_LE(RelativeError(multi->dense[v], single->dense[v]), 1e-5) << "variable " << v;
      }
      EXPECT_LE(RelativeError(multi->categorical, single->categorical), 1e-5);
      EXPECT_LE(RelativeError(multi->wide, single->wide), 1e-5);
    }
  }
}

// The deep and wide tables kept as one table of parts train bitwise as the
// two tables apart (kept apart here by a row limit that differs and is
// never reached), rows and dense variables alike, with an optimizer
// that keeps per-row state and one that keeps per-element momentum.
TEST_F(CtrSyncEquivalenceTest, JointTablesTrainBitwiseAsTheTablesApart) {
  for (const char* optimizer :
       {"adagrad { learning_rate: 0.1 initial_accumulator: 0.0001 }",
        "adam { learning_rate: 0.01 }", "sgd { learning_rate: 0.2 momentum: 0.9 }"}) {
    SCOPED_TRACE(optimizer);
    const JobConfig joint_config = CtrConfig(dir_, 2, optimizer, "POOLING_SUM");
    JobConfig apart_config = joint_config;
    apart_config.mutable_training()->mutable_model()->mutable_embeddings(1)->set_max_rows_per_shard(
        1000000);
    absl::StatusOr<CtrTables> joint_tables = CtrShardTables(joint_config.training());
    absl::StatusOr<CtrTables> apart_tables = CtrShardTables(apart_config.training());
    ASSERT_TRUE(joint_tables.ok() && apart_tables.ok());
    ASSERT_TRUE(joint_tables->joint);
    ASSERT_FALSE(apart_tables->joint);

    absl::StatusOr<TrainedModel> joint = Train(joint_config, 2, ids_);
    ASSERT_TRUE(joint.ok()) << joint.status();
    absl::StatusOr<TrainedModel> apart = Train(apart_config, 2, ids_);
    ASSERT_TRUE(apart.ok()) << apart.status();
    EXPECT_EQ(joint->steps, 2 * kSteps);
    EXPECT_EQ(joint->dense, apart->dense);
    EXPECT_EQ(joint->categorical, apart->categorical);
    EXPECT_EQ(joint->wide, apart->wide);
    // What is compared has trained, and the shards held one table.
    EXPECT_GT(RelativeError(joint->wide, std::vector<float>(ids_.size(), 0.0f)), 0.0);
    for (const StatsResponse& shard : joint->stats) {
      ASSERT_EQ(shard.embeddings_size(), 1);
      EXPECT_EQ(shard.embeddings(0).table(), "categorical+wide");
      EXPECT_EQ(shard.embeddings(0).dim(), 5);
      EXPECT_GT(shard.embeddings(0).rows(), 0);
    }
  }
}

// A shard of a CTR job takes as its first Init only the model the config
// names (ps_server/core/model_share.h): the one this worker declares.
TEST(CtrTrainerModelTest, TheShardsExpectTheModelTheWorkerDeclares) {
  const JobConfig config =
      CtrConfig("/nonexistent", 2, "adam { learning_rate: 0.01 }", "POOLING_MEAN");
  std::optional<ConfigModel> expected = ConfigModelOf(config);
  ASSERT_TRUE(expected.has_value());
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  absl::StatusOr<std::unique_ptr<CtrModel>> model =
      CtrModel::Create(CtrModelSpecFor(config.training()), kernels.get(), 1);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<VariableSpec>& declared = (*model)->mlp().variables();
  ASSERT_EQ(declared.size(), expected->variables.size());
  for (size_t i = 0; i < declared.size(); ++i) {
    EXPECT_EQ(declared[i].name, expected->variables[i].name);
    EXPECT_EQ(declared[i].shape, expected->variables[i].shape) << declared[i].name;
  }
  // The two tables, trained alike, as one (CtrShardTables).
  ASSERT_EQ(expected->embeddings.size(), 1u);
  EXPECT_EQ(expected->embeddings[0].name(), "categorical+wide");
  EXPECT_EQ(expected->embeddings[0].dim(), 5);
  ASSERT_EQ(expected->embeddings[0].parts_size(), 2);
  EXPECT_EQ(expected->embeddings[0].parts(0).name(), "categorical");
  EXPECT_EQ(expected->embeddings[0].parts(1).name(), "wide");
}

}  // namespace PST_FILE_ID
}  // namespace pst
