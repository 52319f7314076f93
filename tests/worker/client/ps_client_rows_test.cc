// PsClient's embedding rows against real in-process shards on loopback:
// ids split over two shards come back in the caller's order, over TCP and
// shared memory and in every wire dtype; SYNC takes the mean of the
// workers' rows; ASYNC applies each row of 4 concurrent workers' pushes
// exactly once; bad rows are refused before anything is sent; and a shard
// that holds only rows trains. The shard's side is
// tests/ps_server/core/parameter_shard_embedding_test.cc.
#include <cmath>
#include <cstdint>
#include <thread>

#include "absl/container/flat_hash_set.h"
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
// One variable whole on each shard.
const std::vector<VariableSpec> kModel = {{"w", {8, 4}}, {"b", {16}}};

JobConfig ConfigFor(Mode mode, int workers) {
  JobConfig config;
  config.mutable_cluster()->add_ps("127.0.0.1:1");
  config.mutable_cluster()->set_workers(workers);
  // The test's clients bring their own model (kModel), as a worker_command
  // job's do; the config's MLP is not what the shards must expect.
  config.mutable_cluster()->set_worker_command("ps_client_rows_test");
  TrainingConfig* t = config.mutable_training();
  t->set_mode(mode);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(kLearningRate);
  t->mutable_model()->mutable_mlp()->add_hidden(8);
  t->mutable_dataset()->mutable_quadratic()->set_examples(10);
  ApplyDefaults(&config);
  return config;
}

EmbeddingTableConfig Table(const std::string& name, int dim) {
  EmbeddingTableConfig table;
  table.set_name(name);
  table.set_dim(dim);
  return table;
}

// Ids of which about half hash to each of two shards, in no sorted order.
std::vector<uint64_t> MixedIds(int count, uint64_t salt) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < count; ++i) ids.push_back(Mix64((salt << 32) + i) >> 24);
  return ids;
}

// A gradient distinct per id and element, exact in every 16-bit type.
float GradientOf(uint64_t id, int element) {
  return static_cast<float>(static_cast<int>(id % 7) - 3) * 0.25f + 0.125f * element;
}
std::vector<float> GradientsOf(const std::vector<uint64_t>& ids, int dim) {
  std::vector<float> rows;
  for (uint64_t id : ids) {
    for (int e = 0; e < dim; ++e) rows.push_back(GradientOf(id, e));
  }
  return rows;
}

class RowsTest : public ::testing::Test {
 protected:
  void Start(Mode mode, int workers, int shards = 2) {
    absl::StatusOr<std::unique_ptr<InProcessCluster>> cluster =
        InProcessCluster::Start(ConfigFor(mode, workers), shards);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = std::move(*cluster);
  }

  std::unique_ptr<PsClient> Connect(int worker, const std::vector<VariableSpec>& model,
                                    PsClient::Transport transport = PsClient::Transport::kTcp,
                                    DType dtype = FLOAT32) {
    const auto& ps = cluster_->config().cluster().ps();
    absl::StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(
        std::vector<std::string>(ps.begin(), ps.end()), worker, absl::Seconds(10));
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    (*client)->SetVariables(model);
    (*client)->SetEmbeddingTables({Table("emb", kDim), Table("wide", 1)});
    (*client)->set_transport(transport);
    (*client)->set_wire_dtype(dtype);
    EXPECT_TRUE((*client)->Register().ok());
    std::vector<std::vector<float>> ones;
    for (const VariableSpec& v : model) ones.emplace_back(v.size(), 1.0f);
    absl::StatusOr<bool> init = (*client)->Init({ones.begin(), ones.end()});
    EXPECT_TRUE(init.ok()) << init.status();
    return std::move(*client);
  }

  // Rows of table 0 as they are now.
  static std::vector<float> Pull(PsClient* client, const std::vector<uint64_t>& ids) {
    std::vector<float> values(ids.size() * kDim, NAN);
    RowValues rows{.table = 0, .ids = ids, .values = values};
    std::vector<int64_t> versions;
    absl::Status pulled =
        client->Exchange({.min_versions = std::vector<int64_t>(client->num_shards(), 0),
                          .timeout = absl::Seconds(10),
                          .pull_rows = {&rows, 1}},
                         &versions, nullptr);
    EXPECT_TRUE(pulled.ok()) << pulled;
    return values;
  }

  static int64_t RowsHeld(PsClient* client, int shard, const std::string& table) {
    absl::StatusOr<StatsResponse> stats = client->Stats(shard);
    EXPECT_TRUE(stats.ok()) << stats.status();
    for (const EmbeddingTableStats& t : stats->embeddings()) {
      if (t.table() == table) return t.rows();
    }
    return -1;
  }

  std::unique_ptr<InProcessCluster> cluster_;
};

struct Wire {
  PsClient::Transport transport;
  DType dtype;
};

class RowsRoundTripTest : public RowsTest, public ::testing::WithParamInterface<Wire> {};

// The exchange that pushes step 0's rows names step 1's ids; the rows come
// back in the caller's order, each updated once.
TEST_P(RowsRoundTripTest, RowsSplitOverTwoShardsComeBackInTheCallersOrder) {
  ASSERT_NO_FATAL_FAILURE(Start(ASYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, kModel, GetParam().transport, GetParam().dtype);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> step0 = MixedIds(40, 1);
  std::vector<uint64_t> step1 = MixedIds(30, 2);  // then 20 of step 0's, interleaved
  for (int i = 0; i < 20; ++i) step1.insert(step1.begin() + 2 * i, step0[i]);
  int on_shard_0 = 0;
  for (uint64_t id : step0) on_shard_0 += ShardOfRow(id, 2) == 0;
  ASSERT_GT(on_shard_0, 5);
  ASSERT_LT(on_shard_0, 35);

  const std::vector<float> before0 = Pull(client.get(), step0);
  const std::vector<float> before1 = Pull(client.get(), step1);
  // The same id reads the same initial value in both pulls.
  for (int k = 0; k < kDim; ++k) EXPECT_EQ(before1[0 * kDim + k], before0[0 * kDim + k]);

  std::vector<std::vector<float>> dense;
  for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), 0.0f);
  std::vector<std::span<const float>> gradients(dense.begin(), dense.end());
  std::vector<std::vector<float>> values = dense;
  const std::vector<float> row_gradients = GradientsOf(step0, kDim);
  std::vector<float> next(step1.size() * kDim, NAN);
  RowGradients push{.table = 0, .ids = step0, .gradients = row_gradients};
  RowValues pull{.table = 0, .ids = step1, .values = next};
  std::vector<int64_t> versions;
  std::vector<PushResponse> responses;
  absl::Status exchanged = client->Exchange({.computed_at = {0, 0},
                                             .gradients = gradients,
                                             .push_rows = {&push, 1},
                                             .min_versions = {1, 1},
                                             .timeout = absl::Seconds(10),
                                             .values = {values.begin(), values.end()},
                                             .pull_rows = {&pull, 1}},
                                            &versions, &responses);
  ASSERT_TRUE(exchanged.ok()) << exchanged;
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(client->uses_shared_memory(0), GetParam().transport == PsClient::Transport::kShm);

  // 16-bit wires round the initial values and the answer.
  const float tolerance = GetParam().dtype == FLOAT32 ? 0.0f : 0.02f;
  for (size_t i = 0; i < step1.size(); ++i) {
    const bool pushed = i < 40 && i % 2 == 0;
    for (int k = 0; k < kDim; ++k) {
      const float expected = before1[i * kDim + k] -
                             (pushed ? kLearningRate * GradientOf(step1[i], k) : 0.0f);
      EXPECT_NEAR(next[i * kDim + k], expected, tolerance) << "id " << step1[i] << " element " << k;
    }
  }
  PsClient* c = client.get();
  EXPECT_EQ(RowsHeld(c, 0, "emb") + RowsHeld(c, 1, "emb"), 40);
  EXPECT_EQ(RowsHeld(c, 0, "emb"), on_shard_0);
  EXPECT_EQ(RowsHeld(c, 0, "wide") + RowsHeld(c, 1, "wide"), 0);
}

INSTANTIATE_TEST_SUITE_P(Wires, RowsRoundTripTest,
                         ::testing::Values(Wire{PsClient::Transport::kTcp, FLOAT32},
                                           Wire{PsClient::Transport::kShm, FLOAT32},
                                           Wire{PsClient::Transport::kTcp, BFLOAT16},
                                           Wire{PsClient::Transport::kShm, FLOAT16}),
                         [](const ::testing::TestParamInfo<Wire>& info) {
                           return absl::StrCat(
                               info.param.transport == PsClient::Transport::kTcp ? "Tcp" : "Shm",
                               DType_Name(info.param.dtype));
                         });

// Rows take many chunks' worth of bytes while the dense share is one
// message each way: over TCP the rows ride in the headers all the same;
// with shared memory 200000 rows (4.8 MB pushed, 3.2 MB answered over the
// two shards) fit each region's room for rows, and 450000 in float32 do
// not, and travel in the headers instead.
TEST_P(RowsRoundTripTest, ManyRowsMoveInOneExchange) {
  ASSERT_NO_FATAL_FAILURE(Start(ASYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, kModel, GetParam().transport, GetParam().dtype);
  ASSERT_NE(client, nullptr);
  absl::flat_hash_set<uint64_t> held;
  int64_t version = 0;
  for (const auto& [count, salt] :
       std::vector<std::pair<int, uint64_t>>{{200000, 9}, {450000, 10}}) {
    SCOPED_TRACE(count);
    const std::vector<uint64_t> ids = MixedIds(count, salt);
    const std::vector<float> before = Pull(client.get(), ids);
    const std::vector<float> rows(ids.size() * kDim, 0.5f);
    std::vector<float> after(ids.size() * kDim, NAN);
    RowGradients push{.table = 0, .ids = ids, .gradients = rows};
    RowValues pull{.table = 0, .ids = ids, .values = after};
    std::vector<std::vector<float>> dense;
    for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), 0.0f);
    std::vector<std::vector<float>> values = dense;
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    ++version;
    absl::Status exchanged = client->Exchange({.computed_at = {version - 1, version - 1},
                                               .gradients = {dense.begin(), dense.end()},
                                               .push_rows = {&push, 1},
                                               .min_versions = {version, version},
                                               .timeout = absl::Seconds(30),
                                               .values = {values.begin(), values.end()},
                                               .pull_rows = {&pull, 1}},
                                              &versions, &responses);
    ASSERT_TRUE(exchanged.ok()) << exchanged;
    const float tolerance = GetParam().dtype == FLOAT32 ? 0.0f : 0.02f;
    for (size_t i = 0; i < after.size(); i += 997) {
      EXPECT_NEAR(after[i], before[i] - kLearningRate * 0.5f, tolerance) << "element " << i;
    }
    held.insert(ids.begin(), ids.end());
    EXPECT_EQ(RowsHeld(client.get(), 0, "emb") + RowsHeld(client.get(), 1, "emb"),
              static_cast<int64_t>(held.size()));
  }
}

// Two SYNC workers push rows of overlapping ids: each row moves by the
// mean of the workers' gradients for it (a worker without the id counts
// zero), as one worker with the combined batch would move it.
TEST_F(RowsTest, SyncTakesTheMeanOfTheWorkersRows) {
  ASSERT_NO_FATAL_FAILURE(Start(SYNC, 2));
  std::unique_ptr<PsClient> clients[2] = {Connect(0, kModel), Connect(1, kModel)};
  ASSERT_NE(clients[0], nullptr);
  ASSERT_NE(clients[1], nullptr);
  const std::vector<uint64_t> all = MixedIds(24, 3);
  const std::vector<uint64_t> ids[2] = {{all.begin(), all.begin() + 16},
                                        {all.begin() + 8, all.end()}};
  const std::vector<float> before = Pull(clients[0].get(), all);
  std::vector<float> after[2];
  absl::Status results[2];
  auto step = [&](int w) {
    std::vector<std::vector<float>> dense;
    for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), w + 1.0f);
    std::vector<std::span<const float>> gradients(dense.begin(), dense.end());
    std::vector<std::vector<float>> values = dense;
    const std::vector<float> rows = GradientsOf(ids[w], kDim);
    after[w].assign(all.size() * kDim, NAN);
    RowGradients push{.table = 0, .ids = ids[w], .gradients = rows};
    RowValues pull{.table = 0, .ids = all, .values = after[w]};
    std::vector<int64_t> versions;
    std::vector<PushResponse> responses;
    results[w] = clients[w]->Exchange({.computed_at = {0, 0},
                                       .gradients = gradients,
                                       .push_rows = {&push, 1},
                                       .min_versions = {1, 1},
                                       .timeout = absl::Seconds(10),
                                       .values = {values.begin(), values.end()},
                                       .pull_rows = {&pull, 1}},
                                      &versions, &responses);
  };
  std::thread other(step, 1);
  step(0);
  other.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  for (size_t i = 0; i < all.size(); ++i) {
    const int holders = (i < 16) + (i >= 8);
    for (int k = 0; k < kDim; ++k) {
      const float expected =
          before[i * kDim + k] - kLearningRate * holders * GradientOf(all[i], k) / 2;
      EXPECT_FLOAT_EQ(after[0][i * kDim + k], expected) << "id " << all[i];
      EXPECT_EQ(after[1][i * kDim + k], after[0][i * kDim + k]);
    }
  }
}

// Tables fed from one list of a batch's ids (a CTR model's deep and wide
// tables): each table gets its own rows, split and put back alike, and a
// repeated id in the shared list is still refused.
TEST_F(RowsTest, TablesSharingOneIdListEachGetTheirRows) {
  ASSERT_NO_FATAL_FAILURE(Start(ASYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, kModel);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> ids = MixedIds(40, 7);
  std::vector<float> emb_before(ids.size() * kDim), wide_before(ids.size());
  {
    const RowValues pulls[] = {{.table = 0, .ids = ids, .values = emb_before},
                               {.table = 1, .ids = ids, .values = wide_before}};
    std::vector<int64_t> versions;
    ASSERT_TRUE(
        client
            ->Exchange({.min_versions = {0, 0}, .timeout = absl::Seconds(10), .pull_rows = pulls},
                       &versions, nullptr)
            .ok());
  }
  const std::vector<float> emb_gradients = GradientsOf(ids, kDim);
  const std::vector<float> wide_gradients = GradientsOf(ids, 1);
  const RowGradients pushes[] = {{.table = 0, .ids = ids, .gradients = emb_gradients},
                                 {.table = 1, .ids = ids, .gradients = wide_gradients}};
  std::vector<PushResponse> responses;
  ASSERT_TRUE(
      client->Exchange({.computed_at = {0, 0}, .push_rows = pushes}, nullptr, &responses).ok());
  std::vector<float> emb_after(ids.size() * kDim, NAN), wide_after(ids.size(), NAN);
  const RowValues pulls[] = {{.table = 0, .ids = ids, .values = emb_after},
                             {.table = 1, .ids = ids, .values = wide_after}};
  std::vector<int64_t> versions;
  ASSERT_TRUE(
      client
          ->Exchange({.min_versions = {1, 1}, .timeout = absl::Seconds(10), .pull_rows = pulls},
                     &versions, nullptr)
          .ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < kDim; ++k) {
      EXPECT_EQ(emb_after[i * kDim + k],
                emb_before[i * kDim + k] - kLearningRate * GradientOf(ids[i], k))
          << "id " << ids[i];
    }
    EXPECT_EQ(wide_after[i], wide_before[i] - kLearningRate * GradientOf(ids[i], 0))
        << "id " << ids[i];
  }

  const std::vector<uint64_t> twice = {ids[0], ids[1], ids[0]};
  const std::vector<float> rows(3 * kDim, 1.0f), wide_rows(3, 1.0f);
  const RowGradients repeated[] = {{.table = 0, .ids = twice, .gradients = rows},
                                   {.table = 1, .ids = twice, .gradients = wide_rows}};
  absl::Status pushed =
      client->Exchange({.computed_at = {1, 1}, .push_rows = repeated}, nullptr, &responses);
  EXPECT_TRUE(absl::IsInvalidArgument(pushed)) << pushed;
  EXPECT_THAT(pushed.message(), HasSubstr(absl::StrCat("id ", ids[0], " appears twice")));
}

// ASYNC: rows pushed alone are applied at once, each push one version.
TEST_F(RowsTest, AsyncRowsPushedAloneApplyAtOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(ASYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, kModel);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> ids = MixedIds(10, 4);
  const std::vector<float> before = Pull(client.get(), ids);
  const std::vector<float> gradients = GradientsOf(ids, kDim);
  RowGradients push{.table = 0, .ids = ids, .gradients = gradients};
  std::vector<PushResponse> responses;
  for (int step = 0; step < 2; ++step) {
    absl::Status pushed =
        client->Exchange({.computed_at = {0, 0}, .push_rows = {&push, 1}}, nullptr, &responses);
    ASSERT_TRUE(pushed.ok()) << pushed;
    for (const PushResponse& response : responses) {
      EXPECT_EQ(response.outcome(), PushResponse::APPLIED);
      EXPECT_EQ(response.version(), step + 1);
    }
  }
  const std::vector<float> after = Pull(client.get(), ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < kDim; ++k) {
      EXPECT_FLOAT_EQ(after[i * kDim + k],
                      before[i * kDim + k] - 2 * kLearningRate * GradientOf(ids[i], k));
    }
  }
}

// ASYNC under 4 concurrent workers: every row gradient of every push is
// applied exactly once, whether it came alone (PushRows) or beside the
// dense gradients (PushPull). Every push adds the same step to the rows
// it names, so a row's final value is its initial value less that step
// once per push that named it, whatever the order the pushes landed in.
TEST_F(RowsTest, AsyncAppliesEveryRowOfFourConcurrentWorkersExactlyOnce) {
  constexpr int kWorkers = 4;
  constexpr int kPushes = 40;  // per worker, half of them PushRows, half PushPull
  constexpr float kGradient = 0.25f;
  ASSERT_NO_FATAL_FAILURE(Start(ASYNC, kWorkers));
  std::unique_ptr<PsClient> clients[kWorkers];
  for (int w = 0; w < kWorkers; ++w) {
    clients[w] = Connect(w, kModel);
    ASSERT_NE(clients[w], nullptr);
  }
  // Worker w names the ids at positions divisible by w + 1: a row is named
  // by 1 to 4 workers.
  const std::vector<uint64_t> all = MixedIds(48, 11);
  std::vector<uint64_t> ids[kWorkers];
  std::vector<int> holders(all.size(), 0);
  for (int w = 0; w < kWorkers; ++w) {
    for (size_t i = 0; i < all.size(); i += w + 1) {
      ids[w].push_back(all[i]);
      ++holders[i];
    }
  }
  const std::vector<float> before = Pull(clients[0].get(), all);
  absl::Status results[kWorkers];
  auto train = [&](int w) {
    const std::vector<float> rows(ids[w].size() * kDim, kGradient);
    RowGradients push{.table = 0, .ids = ids[w], .gradients = rows};
    std::vector<float> pulled(ids[w].size() * kDim);
    RowValues pull{.table = 0, .ids = ids[w], .values = pulled};
    std::vector<std::vector<float>> dense;
    for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), 1.0f);
    const std::vector<std::span<const float>> gradients(dense.begin(), dense.end());
    std::vector<std::vector<float>> values = dense;
    std::vector<int64_t> versions(2, 0);
    std::vector<PushResponse> responses;
    for (int p = 0; p < kPushes && results[w].ok(); ++p) {
      results[w] = p % 2 == 0
                       ? clients[w]->Exchange({.computed_at = versions, .push_rows = {&push, 1}},
                                              nullptr, &responses)
                       : clients[w]->Exchange({.computed_at = versions,
                                               .gradients = gradients,
                                               .push_rows = {&push, 1},
                                               .min_versions = {0, 0},
                                               .timeout = absl::Seconds(10),
                                               .values = {values.begin(), values.end()},
                                               .pull_rows = {&pull, 1}},
                                              &versions, &responses);
      for (const PushResponse& response : responses) {
        if (response.outcome() != PushResponse::APPLIED) {
          results[w] = absl::InternalError(absl::StrCat("push ", p, " was not applied"));
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) threads.emplace_back(train, w);
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w];
  }

  const std::vector<float> after = Pull(clients[0].get(), all);
  for (size_t i = 0; i < all.size(); ++i) {
    for (int k = 0; k < kDim; ++k) {
      float expected = before[i * kDim + k];
      for (int p = 0; p < holders[i] * kPushes; ++p) expected -= kLearningRate * kGradient;
      EXPECT_EQ(after[i * kDim + k], expected) << "id " << all[i] << " (" << holders[i]
                                               << " workers)";
    }
  }
  // The dense variables took each PushPull's gradient once too.
  std::vector<std::vector<float>> dense;
  for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), NAN);
  std::vector<int64_t> versions;
  ASSERT_TRUE(clients[0]
                  ->Exchange({.min_versions = {0, 0},
                              .timeout = absl::Seconds(10),
                              .values = {dense.begin(), dense.end()}},
                             &versions, nullptr)
                  .ok());
  for (const std::vector<float>& values : dense) {
    EXPECT_THAT(values, ::testing::Each(1.0f - kLearningRate * kWorkers * kPushes / 2));
  }
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<StatsResponse> stats = clients[0]->Stats(s);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version(), kWorkers * kPushes) << "shard " << s;
    EXPECT_EQ(stats->pushes_applied(), kWorkers * kPushes) << "shard " << s;
    EXPECT_EQ(stats->pushes_rejected(), 0) << "shard " << s;
  }
}

TEST_F(RowsTest, BadRowsAreRefusedBeforeAnythingIsSent) {
  ASSERT_NO_FATAL_FAILURE(Start(ASYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, kModel);
  ASSERT_NE(client, nullptr);
  std::vector<PushResponse> responses;
  const std::vector<uint64_t> twice = {5, 9, 5};
  const std::vector<uint64_t> ids = MixedIds(3, 5);
  const std::vector<float> three(3 * kDim, 1.0f), short_rows(3 * kDim - 1, 1.0f);
  struct Case {
    RowGradients rows;
    std::string message;
  };
  const Case cases[] = {
      {{.table = 0, .ids = twice, .gradients = three}, "id 5 appears twice"},
      {{.table = 0, .ids = ids, .gradients = short_rows}, "dim 4 needs 12"},
      {{.table = 2, .ids = ids, .gradients = three}, "embedding table 2"},
  };
  for (const Case& c : cases) {
    absl::Status pushed =
        client->Exchange({.computed_at = {0, 0}, .push_rows = {&c.rows, 1}}, nullptr, &responses);
    EXPECT_TRUE(absl::IsInvalidArgument(pushed)) << pushed;
    EXPECT_THAT(pushed.message(), HasSubstr(c.message));
  }
  const RowGradients same_table_twice[] = {{.table = 1, .ids = {}, .gradients = {}},
                                           {.table = 1, .ids = {}, .gradients = {}}};
  EXPECT_TRUE(absl::IsInvalidArgument(client->Exchange(
      {.computed_at = {0, 0}, .push_rows = same_table_twice}, nullptr, &responses)));
  std::vector<float> values(3 * kDim);
  RowValues pull{.table = 0, .ids = twice, .values = values};
  std::vector<int64_t> versions;
  EXPECT_TRUE(absl::IsInvalidArgument(client->Exchange(
      {.min_versions = {0, 0}, .timeout = absl::Seconds(1), .pull_rows = {&pull, 1}}, &versions,
      nullptr)));
  // Nothing reached a shard: no version moved, no row was made.
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<StatsResponse> stats = client->Stats(s);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->version(), 0);
    EXPECT_EQ(RowsHeld(client.get(), s, "emb"), 0);
  }
}

// One dense variable of one row cannot be cut over two shards: shard 1
// holds rows only, and takes part in every SYNC step.
TEST_F(RowsTest, AShardWithoutDenseVariablesHoldsRowsAndKeepsStep) {
  ASSERT_NO_FATAL_FAILURE(Start(SYNC, 1));
  const std::vector<VariableSpec> model = {{"bias", {1}}};
  std::unique_ptr<PsClient> client = Connect(0, model);
  ASSERT_NE(client, nullptr);
  std::vector<float> bias_gradient = {1.0f}, bias = {0.0f};
  std::vector<std::span<const float>> gradients = {bias_gradient};
  std::vector<std::span<float>> out = {bias};
  const std::vector<uint64_t> ids = MixedIds(12, 6);
  const std::vector<float> before = Pull(client.get(), ids);
  std::vector<int64_t> versions = {0, 0};
  for (int step = 0; step < 3; ++step) {
    // Step 2 pushes no row at all: every shard still counts the step.
    const std::vector<float> rows = GradientsOf(ids, kDim);
    RowGradients push{.table = 0, .ids = ids, .gradients = rows};
    std::vector<PushResponse> responses;
    const std::vector<int64_t> at = versions;
    absl::Status exchanged =
        client->Exchange({.computed_at = at,
                          .gradients = gradients,
                          .push_rows = step < 2 ? std::span<const RowGradients>(&push, 1)
                                                : std::span<const RowGradients>(),
                          .min_versions = {at[0] + 1, at[1] + 1},
                          .timeout = absl::Seconds(10),
                          .values = out},
                         &versions, &responses);
    ASSERT_TRUE(exchanged.ok()) << "step " << step << ": " << exchanged;
    EXPECT_EQ(versions, (std::vector<int64_t>{step + 1, step + 1}));
  }
  EXPECT_FLOAT_EQ(bias[0], 1.0f - 3 * kLearningRate);
  const std::vector<float> after = Pull(client.get(), ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < kDim; ++k) {
      EXPECT_FLOAT_EQ(after[i * kDim + k],
                      before[i * kDim + k] - 2 * kLearningRate * GradientOf(ids[i], k));
    }
  }
}

// A model of tables alone: no dense variable anywhere.
TEST_F(RowsTest, AModelOfTablesAloneTrains) {
  ASSERT_NO_FATAL_FAILURE(Start(SYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, {});
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> ids = MixedIds(6, 7);
  const std::vector<float> before = Pull(client.get(), ids);
  const std::vector<float> rows = GradientsOf(ids, kDim);
  std::vector<float> after(ids.size() * kDim);
  RowGradients push{.table = 0, .ids = ids, .gradients = rows};
  RowValues pull{.table = 0, .ids = ids, .values = after};
  std::vector<int64_t> versions;
  std::vector<PushResponse> responses;
  absl::Status exchanged = client->Exchange({.computed_at = {0, 0},
                                             .gradients = {},
                                             .push_rows = {&push, 1},
                                             .min_versions = {1, 1},
                                             .timeout = absl::Seconds(10),
                                             .values = {},
                                             .pull_rows = {&pull, 1}},
                                            &versions, &responses);
  ASSERT_TRUE(exchanged.ok()) << exchanged;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_FLOAT_EQ(after[i * kDim], before[i * kDim] - kLearningRate * GradientOf(ids[i], 0));
  }
}

// The layer-wise exchange carries rows too: pushed with the first Push,
// answered by Finish.
TEST_F(RowsTest, ALayerwiseExchangeCarriesRows) {
  ASSERT_NO_FATAL_FAILURE(Start(SYNC, 1));
  std::unique_ptr<PsClient> client = Connect(0, kModel);
  ASSERT_NE(client, nullptr);
  const std::vector<uint64_t> ids = MixedIds(16, 8);
  const std::vector<float> before = Pull(client.get(), ids);
  std::vector<std::vector<float>> dense;
  for (const VariableSpec& v : kModel) dense.emplace_back(v.size(), 0.0f);
  std::vector<std::vector<float>> values = dense;
  const std::vector<float> rows = GradientsOf(ids, kDim);
  std::vector<float> after(ids.size() * kDim, NAN);
  RowGradients push{.table = 0, .ids = ids, .gradients = rows};
  RowValues pull{.table = 0, .ids = ids, .values = after};
  absl::StatusOr<std::unique_ptr<StepExchange>> exchange =
      client->BeginExchange({.computed_at = {0, 0},
                             .gradients = {dense.begin(), dense.end()},
                             .push_rows = {&push, 1},
                             .min_versions = {1, 1},
                             .timeout = absl::Seconds(10),
                             .values = {values.begin(), values.end()},
                             .pull_rows = {&pull, 1}},
                            {1, 0});
  ASSERT_TRUE(exchange.ok()) << exchange.status();
  const int last[] = {1}, first[] = {0};
  ASSERT_TRUE((*exchange)->Push(last).ok());
  ASSERT_TRUE((*exchange)->Push(first).ok());
  std::vector<int64_t> versions;
  std::vector<PushResponse> responses;
  absl::Status finished = (*exchange)->Finish(&versions, &responses);
  ASSERT_TRUE(finished.ok()) << finished;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_FLOAT_EQ(after[i * kDim + 1],
                    before[i * kDim + 1] - kLearningRate * GradientOf(ids[i], 1));
  }
}

}  // namespace PST_FILE_ID
}  // namespace pst
