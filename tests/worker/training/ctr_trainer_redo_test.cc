// The CTR trainer redoes a step a shard refused for now: with every
// exchange the worker may open held on the shard, a step's exchange is
// refused (overloaded); the worker backs off, rejoins and computes the step
// again on its own batch, and the run ends bitwise as one never refused.
#include <atomic>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "rpc/worker_session.h"
#include "tests/support/commands.h"
#include "tests/support/eventually.h"
#include "tests/support/exchange_calls.h"
#include "worker/training/ctr_trainer.h"

namespace pst {
namespace PST_FILE_ID {

constexpr int kBatch = 16;
constexpr int kSteps = 12;

JobConfig CtrJob(const std::string& dir) {
  absl::StatusOr<JobConfig> config = ParseConfig(
      absl::StrCat(
          "cluster { ps: \"127.0.0.1:1\" workers: 1 } ",
          "training { mode: SYNC batch_size: ", kBatch,
          " epochs: 1 seed: 3 log_every_steps: 1000000 pull_timeout_seconds: 60 ",
          "optimizer { adagrad { learning_rate: 0.05 } } ",
          "model { ctr { table: \"categorical\" wide_table: \"wide\" hidden: 8 } ",
          "embeddings { name: \"categorical\" dim: 4 init_scale: 0.05 } ",
          "embeddings { name: \"wide\" dim: 1 init_scale: 0 } } ",
          "dataset { ctr { train_file: \"", dir, "/train.tsv\" test_file: \"", dir,
          "/test.tsv\" format: CRITEO } } }"),
      "ctr_trainer_redo_test");
  EXPECT_TRUE(config.ok()) << config.status();
  ApplyDefaults(&*config);
  EXPECT_TRUE(ValidateConfig(*config).ok()) << ValidateConfig(*config);
  return *config;
}

// Every exchange worker 0 may have open on the shard, held (each waits for
// a version that never comes), so the worker's next exchange is refused.
class HeldExchanges {
 public:
  HeldExchanges(ParameterServer::Stub* stub, int worker) {
    PullRequest pull;
    pull.set_min_version(1 << 30);
    pull.set_timeout_ms(600000);
    for (int i = 0; i < RpcLimits().max_streams_per_worker; ++i) {
      contexts_.push_back(std::make_unique<grpc::ClientContext>());
      contexts_.back()->AddMetadata(kSessionMetadataKey, absl::StrCat(ProcessSession()));
      streams_.push_back(stub->Exchange(contexts_.back().get()));
      EXPECT_TRUE(streams_.back()->Write(PullOnly(pull, worker)));
    }
  }
  ~HeldExchanges() { Release(); }

  void Release() {
    for (auto& context : contexts_) context->TryCancel();
    for (auto& stream : streams_) stream->Finish().IgnoreError();
    streams_.clear();
    contexts_.clear();
  }

 private:
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<ExchangeChunk, ExchangeAnswer>>> streams_;
};

struct TrainedRun {
  WorkerResult result;
  std::vector<std::vector<float>> dense;
  StatsResponse stats;
  int pushes = 0;  // times the before-push hook ran
};

// Trains the job on one shard; `refuse_push`, if > 0, is the push whose
// exchange the shard refuses for now.
absl::StatusOr<TrainedRun> Train(const JobConfig& job, int refuse_push) {
  PST_ASSIGN_OR_RETURN(std::unique_ptr<InProcessCluster> cluster, InProcessCluster::Start(job, 1));
  const JobConfig& config = cluster->config();
  const std::string address = config.cluster().ps(0);
  PST_ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client,
                       PsClient::Connect({address}, 0, absl::Seconds(10)));
  std::unique_ptr<ParameterServer::Stub> stub = ParameterServer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto refused = [&stub] {
    StatsResponse stats;
    grpc::ClientContext context;
    return stub->Stats(&context, StatsRequest(), &stats).ok() && stats.exchanges_refused() > 0;
  };
  std::unique_ptr<Kernels> kernels = MakeCpuKernels();
  CtrTrainer trainer(config, 0, client.get(), kernels.get(), std::nullopt);
  TrainedRun run;
  std::unique_ptr<HeldExchanges> held;
  std::thread release;
  trainer.set_before_push([&] {
    if (++run.pushes != refuse_push) return;
    held = std::make_unique<HeldExchanges>(stub.get(), /*worker=*/0);
    release = std::thread([&] {
      EXPECT_TRUE(Eventually(refused, absl::Seconds(120))) << "the push was never refused";
      held->Release();
    });
  });
  absl::StatusOr<WorkerResult> result = trainer.Run();
  if (release.joinable()) release.join();
  PST_RETURN_IF_ERROR(result.status());
  run.result = *std::move(result);
  if (refuse_push > 0 && !refused()) return absl::InternalError("no exchange was refused");
  std::unique_ptr<Kernels> host = MakeCpuKernels();
  PST_ASSIGN_OR_RETURN(std::unique_ptr<CtrModel> shape,
                       CtrModel::Create(CtrModelSpecFor(config.training()), host.get(), 1));
  for (const VariableSpec& v : shape->mlp().variables()) run.dense.emplace_back(v.size(), NAN);
  std::vector<std::span<float>> dense(run.dense.begin(), run.dense.end());
  std::vector<int64_t> versions;
  PST_RETURN_IF_ERROR(client->Exchange(
      {.min_versions = {0}, .timeout = absl::Seconds(10), .values = dense}, &versions, nullptr));
  PST_ASSIGN_OR_RETURN(run.stats, client->Stats(0));
  return run;
}

TEST(CtrTrainerRedoTest, AStepRefusedForNowIsRedoneAndTheRunEndsAsOneNeverRefused) {
  const std::string dir = absl::StrCat(ScratchDir(), "/ctr_trainer_redo_test");
  std::filesystem::create_directories(dir);
  CtrGeneratorOptions options;
  options.train_examples = kBatch * kSteps;
  options.test_examples = 32;
  options.distinct = {40};
  options.seed = 7;
  ASSERT_TRUE(GenerateCtrFiles(options, dir + "/train.tsv", dir + "/test.tsv").ok());
  const JobConfig job = CtrJob(dir);

  absl::StatusOr<TrainedRun> undisturbed = Train(job, /*refuse_push=*/0);
  ASSERT_TRUE(undisturbed.ok()) << undisturbed.status();
  absl::StatusOr<TrainedRun> refused = Train(job, /*refuse_push=*/3);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(refused.ok()) << refused.status();

  EXPECT_EQ(refused->result.steps(), kSteps);
  EXPECT_EQ(refused->result.steps(), undisturbed->result.steps());
  // The refused step was computed twice, so its hook ran twice.
  EXPECT_EQ(refused->pushes, kSteps + 1);
  EXPECT_EQ(refused->stats.version(), undisturbed->stats.version());
  EXPECT_EQ(refused->result.test_auc(), undisturbed->result.test_auc());
  ASSERT_EQ(refused->dense.size(), undisturbed->dense.size());
  for (size_t v = 0; v < refused->dense.size(); ++v) {
    EXPECT_EQ(refused->dense[v], undisturbed->dense[v]) << "variable " << v;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
