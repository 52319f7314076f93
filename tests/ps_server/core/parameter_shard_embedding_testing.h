// What the tests of parameter_shard_embedding share: small models, requests and checks.
#ifndef PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_EMBEDDING_TESTING_H_
#define PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_EMBEDDING_TESTING_H_

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/parameter_shard.h"
#include "ps_server/core/shard_calls.h"
#include "ps_server/core/streamed_update.h"

namespace pst::shard_embedding_testing {

inline constexpr int kDim = 4;

inline ShardOptions Options(Mode mode, int workers, int shard = 0, int num_shards = 1) {
  ShardOptions options;
  options.mode = mode;
  options.num_workers = workers;
  options.staleness = mode == SSP ? 2 : 0;
  options.shard = shard;
  options.num_shards = num_shards;
  options.seed = 11;
  options.optimizer.mutable_sgd()->set_learning_rate(0.5f);
  return options;
}

inline std::unique_ptr<ParameterShard> MakeShard(const ShardOptions& options) {
  absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return std::move(*shard);
}

// A dense "b" [2] = {0, 0} and the table "emb" (kDim, default initial
// values, at most `max_rows` rows per shard; 0: the default).
inline void Init(ParameterShard* shard, int64_t max_rows = 0,
                 EmbeddingTableConfig::WhenFull when_full =
                     EmbeddingTableConfig::WHEN_FULL_UNSPECIFIED) {
  InitRequest init;
  EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{0, 0}, init.add_variables());
  EmbeddingTableConfig* table = init.add_embeddings();
  table->set_name("emb");
  table->set_dim(kDim);
  table->set_max_rows_per_shard(max_rows);
  table->set_when_full(when_full);
  InitResponse response;
  ASSERT_TRUE(shard->Init(init, &response).ok());
  ASSERT_TRUE(response.accepted());
}

inline std::string IdBytes(const std::vector<uint64_t>& ids) {
  // An empty vector's data() may be null, which memcpy may not be given.
  return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t));
}

// Rows of "emb": ids and, row after row, their float32 gradients.
inline EmbeddingRows Rows(const std::vector<uint64_t>& ids, const std::vector<float>& values = {}) {
  EmbeddingRows rows;
  rows.set_table("emb");
  rows.set_ids(IdBytes(ids));
  rows.set_dtype(FLOAT32);
  rows.set_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return rows;
}

inline PushRequest RowPush(int worker, int64_t version, const std::vector<uint64_t>& ids,
                    const std::vector<float>& values, bool with_dense = true) {
  PushRequest push;
  push.set_worker(worker);
  push.set_computed_at_version(version);
  if (with_dense) {
    EncodeTensor("b", std::vector<int64_t>{2}, std::vector<float>{1, 1}, push.add_gradients());
  }
  *push.add_rows() = Rows(ids, values);
  return push;
}

// The values of "emb"'s rows `ids` (row after row) and of "b", as pulled.
struct Pulled {
  int64_t version = 0;
  std::vector<float> rows;
  std::vector<float> dense;
};

inline Pulled PullAll(ParameterShard* shard, const std::vector<uint64_t>& ids, int worker = 0) {
  PullRequest pull;
  pull.set_worker(worker);
  pull.add_names("b");
  *pull.add_rows() = Rows(ids);
  PullResponse response;
  const absl::Status status = Pull(*shard, pull, absl::Now(), &response);
  EXPECT_TRUE(status.ok()) << status;
  Pulled pulled;
  pulled.version = response.version();
  EXPECT_EQ(response.rows_size(), 1);
  if (response.rows_size() != 1 || response.variables_size() != 1) return pulled;
  EXPECT_EQ(response.rows(0).table(), "emb");
  EXPECT_EQ(response.rows(0).ids(), "");  // the answer carries values only
  pulled.rows.resize(response.rows(0).data().size() / sizeof(float));
  DecodeValues(response.rows(0).data(), response.rows(0).dtype(), pulled.rows);
  pulled.dense.resize(2);
  DecodeTensor(response.variables(0), pulled.dense);
  return pulled;
}

// Gradient rows for `ids`, each element a distinct value that depends on
// `worker`, so that sums in another order would round differently.
inline std::vector<float> Gradients(int worker, const std::vector<uint64_t>& ids) {
  std::vector<float> values;
  for (uint64_t id : ids) {
    for (int k = 0; k < kDim; ++k) {
      values.push_back(0.1f * static_cast<float>(worker + 1) + 1e-3f * static_cast<float>(id) +
                       1.0f / static_cast<float>(k + 3 + worker));
    }
  }
  return values;
}

inline const std::vector<std::vector<uint64_t>> kBatches = {{1, 2, 3}, {3, 2, 7}, {9, 1, 3}};
inline const std::vector<uint64_t> kAllIds = {1, 2, 3, 7, 9};

// What one worker with the three batches combined pushes: per id, the sum
// of every worker's row (in rank order, 0 for a worker without the id)
// over the 3 workers.
inline PushRequest CombinedPush(int64_t version) {
  std::vector<float> combined;
  for (uint64_t id : kAllIds) {
    for (int k = 0; k < kDim; ++k) {
      float sum = 0.0f;
      for (int w = 0; w < 3; ++w) {
        const std::vector<uint64_t>& batch = kBatches[w];
        auto it = std::find(batch.begin(), batch.end(), id);
        if (it == batch.end()) continue;
        sum += Gradients(w, batch)[(it - batch.begin()) * kDim + k];
      }
      combined.push_back(sum * (1.0f / 3.0f));
    }
  }
  return RowPush(0, version, kAllIds, combined);
}

}  // namespace pst::shard_embedding_testing

#endif  // PST_TESTS_PS_SERVER_CORE_PARAMETER_SHARD_EMBEDDING_TESTING_H_
