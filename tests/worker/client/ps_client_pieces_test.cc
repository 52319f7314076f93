// PsClient pieces a pull of more embedding rows than one call to a shard
// carries (the shard's --max_reply_bytes and --max_message_bytes, which
// Register learns): against real in-process shards with small limits, the
// rows come back as from shards with the default limits, over TCP and
// shared memory, whether the answer or the request bounds them; in SYNC
// the pieced pull reads the step both workers' pushes made, one version
// per step; a push whose rows are more than one request is refused,
// naming the shard and the flag, before it is sent.
#include <cmath>
#include <cstdint>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/in_process_cluster.h"
#include "common/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "worker/client/ps_client.h"

namespace pst {
namespace PST_FILE_ID {

using ::testing::HasSubstr;

constexpr float kLearningRate = 0.5f;
constexpr int kDim = 4;
const std::vector<VariableSpec> kModel = {{"w", {8, 4}}, {"b", {16}}};
// About 1800 float32 rows of dim 4 per answer: a pull of 8000 rows takes
// three calls to each of two shards. (The shard's transport holds these
// two limits' sum of messages in flight, so they cannot be much smaller.)
constexpr RpcLimits kSmall = {.max_request_bytes = 1 << 20, .max_reply_bytes = 32 << 10};

JobConfig ConfigFor(Mode mode, int workers) {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(workers);
  // The test's clients bring their own model (kModel).
  config.mutable_cluster()->set_worker_command("ps_client_pieces_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(mode);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(kLearningRate);
  t->mutable_model()->mutable_mlp()->add_hidden(8);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

std::vector<uint64_t> MixedIds(int count, uint64_t salt) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < count; ++i) ids.push_back(Mix64((salt << 32) + i) >> 24);
  return ids;
}

float GradientOf(uint64_t id, int element) {
  return static_cast<float>(static_cast<int>(id % 7) - 3) * 0.25f + 0.125f * element;
}

std::vector<float> GradientsOf(const std::vector<uint64_t>& ids) {
  std::vector<float> rows;
  for (uint64_t id : ids) {
    for (int e = 0; e < kDim; ++e) rows.push_back(GradientOf(id, e));
  }
  return rows;
}

std::unique_ptr<PsClient> Connect(const InProcessCluster& cluster, int worker,
                                  PsClient::Transport transport) {
  const auto& ps = cluster.config().cluster().ps();
  absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(
      std::vector<std::string>(ps.begin(), ps.end()), worker, absl::Seconds(10));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  EmbeddingTableConfig table;
  table.set_name("emb");
  table.set_dim(kDim);
  (*client)->SetVariables(kModel);
  (*client)->SetEmbeddingTables({table});
  (*client)->set_transport(transport);
  EXPECT_TRUE((*client)->Register().ok());
  std::vector<std::vector<float>> ones;
  for (const VariableSpec& v : kModel) ones.emplace_back(v.size(), 1.0f);
  absl::StatusOr<bool> init = (*client)->Init({ones.begin(), ones.end()});
  EXPECT_TRUE(init.ok()) << init.status();
  return std::move(*client);
}

std::unique_ptr<InProcessCluster> StartCluster(Mode mode, int workers, const RpcLimits& limits) {
  absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
      InProcessCluster::Start(ConfigFor(mode, workers), /*num_shards=*/2, limits);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

std::vector<float> PullRows(PsClient* client, const std::vector<uint64_t>& ids) {
  std::vector<float> values(ids.size() * kDim, NAN);
  RowValues rows{.table = 0, .ids = ids, .values = values};
  std::vector<int64_t> versions;
  absl::Status pulled = client->Exchange(
      {.min_versions = {0, 0}, .timeout = absl::Seconds(10), .pull_rows = {&rows, 1}}, &versions,
      nullptr);
  EXPECT_TRUE(pulled.ok()) << pulled;
  return values;
}

// What one worker's step sees: the rows before, the rows the step's
// exchange answers (after its push of `pushed`), and the rows a plain Pull
// reads then.
struct Seen {
  std::vector<float> before, answered, after;
  std::vector<int64_t> versions;
};

Seen Step(PsClient* client, const std::vector<uint64_t>& pushed,
          const std::vector<uint64_t>& pulled) {
  Seen seen;
  seen.before = PullRows(client, pulled);
  std::vector<std::vector<float>> dense;
  for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), 0.0f);
  std::vector<std::vector<float>> values = dense;
  const std::vector<float> gradients = GradientsOf(pushed);
  seen.answered.assign(pulled.size() * kDim, NAN);
  RowGradients push{.table = 0, .ids = pushed, .gradients = gradients};
  RowValues pull{.table = 0, .ids = pulled, .values = seen.answered};
  std::vector<PushResponse> responses;
  absl::Status exchanged = client->Exchange({.computed_at = {0, 0},
                                             .gradients = {dense.begin(), dense.end()},
                                             .push_rows = {&push, 1},
                                             .min_versions = {1, 1},
                                             .timeout = absl::Seconds(30),
                                             .values = {values.begin(), values.end()},
                                             .pull_rows = {&pull, 1}},
                                            &seen.versions, &responses);
  EXPECT_TRUE(exchanged.ok()) << exchanged;
  seen.after.assign(pulled.size() * kDim, NAN);
  RowValues again{.table = 0, .ids = pulled, .values = seen.after};
  std::vector<int64_t> versions;
  absl::Status read = client->Exchange({.min_versions = {0, 0},
                                        .timeout = absl::Seconds(10),
                                        .values = {values.begin(), values.end()},
                                        .pull_rows = {&again, 1}},
                                       &versions, nullptr);
  EXPECT_TRUE(read.ok()) << read;
  return seen;
}

// The ids of one step: 1000 pushed, and 8000 pulled, the pushed ones
// among them (every other one of the first 2000).
struct Batch {
  std::vector<uint64_t> pushed = MixedIds(1000, 1);
  std::vector<uint64_t> pulled;
  Batch() {
    pulled = MixedIds(7000, 2);
    for (int i = 0; i < 1000; ++i) pulled.insert(pulled.begin() + 2 * i, pushed[i]);
  }
};

// `seen.answered` is `seen.before` moved by `scale` x each pushed row's
// gradient.
void ExpectStepped(const Batch& batch, const Seen& seen, float scale) {
  for (size_t i = 0; i < batch.pulled.size(); ++i) {
    const bool pushed = i < 2000 && i % 2 == 0;
    for (int k = 0; k < kDim; ++k) {
      const float expected = seen.before[i * kDim + k] -
                             (pushed ? scale * GradientOf(batch.pulled[i], k) : 0.0f);
      ASSERT_NEAR(seen.answered[i * kDim + k], expected, 1e-6f)
          << "row " << i << " element " << k;
    }
  }
}

class PiecesTest : public ::testing::TestWithParam<PsClient::Transport> {};

TEST_P(PiecesTest, PiecedRowsMatchOneMessage) {
  const Batch batch;
  // Each shard's share of the pulled rows is past one small answer.
  ASSERT_GT(static_cast<int64_t>(batch.pulled.size() / 2 * kDim * sizeof(float)),
            kSmall.max_reply_bytes);
  Seen seen[2];
  for (int pieced = 0; pieced < 2; ++pieced) {
    std::unique_ptr<InProcessCluster> cluster =
        StartCluster(ASYNC, 1, pieced ? kSmall : RpcLimits{});
    ASSERT_NE(cluster, nullptr);
    std::unique_ptr<PsClient> client = Connect(*cluster, 0, GetParam());
    ASSERT_NE(client, nullptr);
    seen[pieced] = Step(client.get(), batch.pushed, batch.pulled);
    EXPECT_EQ(seen[pieced].versions, (std::vector<int64_t>{1, 1}));
    for (int s = 0; s < 2; ++s) {
      absl::StatusOr<StatsResponse> stats = client->Stats(s);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->pushes_applied(), 1) << "shard " << s;
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectStepped(batch, seen[1], kLearningRate));
  EXPECT_EQ(seen[1].before, seen[0].before);
  EXPECT_EQ(seen[1].answered, seen[0].answered);
  EXPECT_EQ(seen[1].after, seen[0].answered);
  EXPECT_EQ(seen[0].after, seen[0].answered);
}

INSTANTIATE_TEST_SUITE_P(Transports, PiecesTest,
                         ::testing::Values(PsClient::Transport::kTcp, PsClient::Transport::kShm),
                         [](const ::testing::TestParamInfo<PsClient::Transport>& info) {
                           return info.param == PsClient::Transport::kTcp ? "Tcp" : "Shm";
                         });

// A request bounds the ids one pull names as an answer bounds the rows:
// 40000 ids are 160 KB per shard, past a 128 KiB request.
TEST(IdPiecesTest, IdsPastOneRequestArePieced) {
  const std::vector<uint64_t> ids = MixedIds(40000, 4);
  std::vector<float> rows[2];
  for (int pieced = 0; pieced < 2; ++pieced) {
    std::unique_ptr<InProcessCluster> cluster = StartCluster(
        ASYNC, 1,
        pieced ? RpcLimits{.max_request_bytes = 128 << 10, .max_reply_bytes = 1 << 20}
               : RpcLimits{});
    ASSERT_NE(cluster, nullptr);
    std::unique_ptr<PsClient> client = Connect(*cluster, 0, PsClient::Transport::kTcp);
    ASSERT_NE(client, nullptr);
    rows[pieced] = PullRows(client.get(), ids);
  }
  EXPECT_THAT(rows[1], ::testing::Each(::testing::Not(::testing::IsNan())));
  EXPECT_EQ(rows[1], rows[0]);
}

// Two SYNC workers push the same rows: the step lands once, as one version
// on each shard, and every part of each worker's pieced pull reads it.
TEST(SyncPiecesTest, EveryPartReadsTheStepBothWorkersMade) {
  std::unique_ptr<InProcessCluster> cluster = StartCluster(SYNC, 2, kSmall);
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<PsClient> clients[2] = {Connect(*cluster, 0, PsClient::Transport::kTcp),
                                          Connect(*cluster, 1, PsClient::Transport::kTcp)};
  ASSERT_NE(clients[0], nullptr);
  ASSERT_NE(clients[1], nullptr);
  const Batch batch;
  Seen seen[2];
  std::thread other([&] { seen[1] = Step(clients[1].get(), batch.pushed, batch.pulled); });
  seen[0] = Step(clients[0].get(), batch.pushed, batch.pulled);
  other.join();
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(seen[w].versions, (std::vector<int64_t>{1, 1})) << "worker " << w;
    // Both pushed the same gradient: the mean moves each row by it once.
    ASSERT_NO_FATAL_FAILURE(ExpectStepped(batch, seen[w], kLearningRate));
  }
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<StatsResponse> stats = clients[0]->Stats(s);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version(), 1) << "shard " << s;
  }
}

// A push is one update: rows past one request are refused before anything
// is sent, naming the shard and the flag.
TEST(PushPiecesTest, APushPastOneRequestIsRefusedBeforeItIsSent) {
  std::unique_ptr<InProcessCluster> cluster = StartCluster(ASYNC, 1, kSmall);
  ASSERT_NE(cluster, nullptr);
  std::unique_ptr<PsClient> client = Connect(*cluster, 0, PsClient::Transport::kTcp);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> ids = MixedIds(100000, 3);  // 1.2 MB of rows per shard
  const std::vector<float> gradients = GradientsOf(ids);
  RowGradients push{.table = 0, .ids = ids, .gradients = gradients};
  std::vector<PushResponse> responses;
  absl::Status pushed =
      client->Exchange({.computed_at = {0, 0}, .push_rows = {&push, 1}}, nullptr, &responses);
  EXPECT_TRUE(absl::IsResourceExhausted(pushed)) << pushed;
  EXPECT_THAT(pushed.message(), HasSubstr("ps:0"));
  EXPECT_THAT(pushed.message(), HasSubstr("--max_message_bytes"));
  EXPECT_FALSE(IsTransientShardError(pushed));
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<StatsResponse> stats = client->Stats(s);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version(), 0) << "shard " << s;
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
