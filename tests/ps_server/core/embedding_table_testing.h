// What the tests of embedding_table share: small models, requests and checks.
#ifndef PST_TESTS_PS_SERVER_CORE_EMBEDDING_TABLE_TESTING_H_
#define PST_TESTS_PS_SERVER_CORE_EMBEDDING_TABLE_TESTING_H_

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/embedding_config.h"
#include "common/tensor_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "placement/row_placement.h"
#include "ps_server/core/embedding_init.h"
#include "ps_server/core/embedding_table.h"
#include "tests/support/fresh_dir.h"

namespace pst::embedding_testing {

inline constexpr uint64_t kSeed = 7;

inline OptimizerConfig Sgd(float lr, float momentum = 0) {
  OptimizerConfig config;
  config.mutable_sgd()->set_learning_rate(lr);
  config.mutable_sgd()->set_momentum(momentum);
  return config;
}

inline OptimizerConfig Adagrad(float lr, float initial_accumulator) {
  OptimizerConfig config;
  config.mutable_adagrad()->set_learning_rate(lr);
  config.mutable_adagrad()->set_initial_accumulator(initial_accumulator);
  return config;
}

inline OptimizerConfig Adam(float lr) {
  OptimizerConfig config;
  config.mutable_adam()->set_learning_rate(lr);
  return config;
}

inline OptimizerConfig Ftrl(float alpha, float beta, float l1, float l2, float initial_accumulator = 0) {
  OptimizerConfig config;
  config.mutable_ftrl()->set_initial_accumulator(initial_accumulator);
  config.mutable_ftrl()->set_learning_rate(alpha);
  config.mutable_ftrl()->set_beta(beta);
  config.mutable_ftrl()->set_l1(l1);
  config.mutable_ftrl()->set_l2(l2);
  return config;
}

inline EmbeddingTableConfig Spec(const std::string& name, int dim,
                          std::optional<OptimizerConfig> optimizer = std::nullopt,
                          int64_t max_rows = 0, std::optional<float> init_scale = 0.0f) {
  EmbeddingTableConfig spec;
  spec.set_name(name);
  spec.set_dim(dim);
  if (optimizer) *spec.mutable_optimizer() = *optimizer;
  spec.set_max_rows_per_shard(max_rows);
  if (init_scale) spec.set_init_scale(*init_scale);
  return spec;
}

// `spec` as a table of parts (EmbeddingTableConfig.parts).
struct PartSpec {
  std::string name;
  int dim;
  float init_scale;
};
inline EmbeddingTableConfig Parted(EmbeddingTableConfig spec, const std::vector<PartSpec>& parts) {
  for (const PartSpec& p : parts) {
    EmbeddingTablePart* part = spec.add_parts();
    part->set_name(p.name);
    part->set_dim(p.dim);
    part->set_init_scale(p.init_scale);
  }
  return spec;
}

// `spec`, refusing new rows at its row limit instead of evicting.
inline EmbeddingTableConfig Refusing(EmbeddingTableConfig spec) {
  spec.set_when_full(EmbeddingTableConfig::REFUSE_NEW_ROWS);
  return spec;
}

inline EmbeddingTableOptions Options(int shard = 0, int num_shards = 1, int workers = 1,
                              uint64_t seed = kSeed) {
  EmbeddingTableOptions options;
  options.shard = shard;
  options.num_shards = num_shards;
  options.num_workers = workers;
  options.seed = seed;
  options.optimizer = Sgd(0.5f);  // the job's
  return options;
}

inline std::unique_ptr<EmbeddingTable> Make(const std::vector<EmbeddingTableConfig>& specs,
                                     EmbeddingTableOptions options = Options()) {
  auto table = std::make_unique<EmbeddingTable>(std::move(options));
  InitRequest init;
  for (const EmbeddingTableConfig& spec : specs) *init.add_embeddings() = spec;
  EXPECT_TRUE(table->Initialize(init).ok());
  return table;
}

inline std::string IdBytes(const std::vector<uint64_t>& ids) {
  std::string bytes(ids.size() * sizeof(uint64_t), '\0');
  if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
  return bytes;
}

inline EmbeddingRows Rows(const std::string& table, const std::vector<uint64_t>& ids,
                   const std::vector<float>& gradients, DType dtype = FLOAT32) {
  EmbeddingRows rows;
  rows.set_table(table);
  rows.set_ids(IdBytes(ids));
  rows.set_dtype(dtype);
  EncodeValues(gradients, dtype, rows.mutable_data());
  return rows;
}

inline PushRequest Push(std::vector<EmbeddingRows> parts, int worker = 0) {
  PushRequest push;
  push.set_worker(worker);
  for (EmbeddingRows& part : parts) *push.add_rows() = std::move(part);
  return push;
}

// An ASYNC update: checked, staged, committed (or discarded on failure).
inline absl::Status Apply(EmbeddingTable& table, const PushRequest& push, float lr_scale = 1.0f) {
  TablePush plan;
  if (absl::Status s = table.CheckPush(push, false, true, &plan); !s.ok()) return s;
  if (absl::Status s = table.Stage(push, plan, UpdateSettings(lr_scale, nullptr)); !s.ok()) {
    table.Discard();
    return s;
  }
  table.Commit();
  return absl::OkStatus();
}

inline std::vector<float> Lookup(const EmbeddingTable& table, const std::string& name,
                          const std::vector<uint64_t>& ids) {
  std::vector<float> out(ids.size() * table.dim(name));
  EXPECT_TRUE(table.Lookup(name, ids, out).ok());
  return out;
}

inline ShardCheckpoint Exported(const EmbeddingTable& table) {
  ShardCheckpoint checkpoint;
  table.Export(&checkpoint);
  return checkpoint;
}

inline std::string Snapshot(const EmbeddingTable& table) { return Exported(table).SerializeAsString(); }

inline EmbeddingTableStats StatsOf(const EmbeddingTable& table, const std::string& name) {
  StatsResponse stats;
  table.AddStats(&stats);
  for (const EmbeddingTableStats& s : stats.embeddings()) {
    if (s.table() == name) return s;
  }
  ADD_FAILURE() << "no stats for " << name;
  return {};
}

// The first `count` ids of shard `shard` of `num_shards`, from `from` on.
inline std::vector<uint64_t> IdsOfShard(int shard, int num_shards, int count, uint64_t from = 0) {
  std::vector<uint64_t> ids;
  for (uint64_t id = from; static_cast<int>(ids.size()) < count; ++id) {
    if (ShardOfRow(id, num_shards) == shard) ids.push_back(id);
  }
  return ids;
}

// A fresh directory under the test's temporary directory, named for `name`
// and this process.
inline std::string FreshDir(const std::string& name) { return FreshScratchDir(name); }

// A table's rows by id, as bytes: values, slots, update count.
using RowMap = std::map<uint64_t, std::tuple<std::string, std::string, int64_t>>;

inline RowMap RowsOf(const ShardCheckpoint::Embedding& e) {
  RowMap rows;
  const size_t n = e.ids().size() / 8;
  const size_t values = n ? e.values().size() / n : 0;
  const size_t slots = n ? e.slots().size() / n : 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t id;
    int64_t updates;
    std::memcpy(&id, e.ids().data() + i * 8, 8);
    std::memcpy(&updates, e.row_updates().data() + i * 8, 8);
    rows[id] = {e.values().substr(i * values, values), e.slots().substr(i * slots, slots),
                updates};
  }
  return rows;
}

// The rows of `table`'s first table, as Export writes them.
inline RowMap RowsOf(const EmbeddingTable& table) { return RowsOf(Exported(table).embeddings(0)); }

// The memory rule (TableStorage.memory_bytes): a row's record (values,
// slots, update count and tick), its id, and twice its index entry.
inline int64_t RowBytes(int dim, int slots_per_value) {
  return int64_t{dim} * (1 + slots_per_value) * 4 + 16 + 8 + 2 * 13;
}

// `spec` holding `rows` rows in RAM and the rest under `dir`.
inline EmbeddingTableConfig Tiered(EmbeddingTableConfig spec, int64_t rows, const std::string& dir,
                                   int slots_per_value, int64_t ttl = 0) {
  spec.mutable_storage()->set_memory_bytes(rows * RowBytes(spec.dim(), slots_per_value));
  spec.mutable_storage()->set_disk(dir);
  spec.mutable_storage()->set_ttl_steps(ttl);
  return spec;
}

// Gradients for `ids`, different per id and step.
inline std::vector<float> Gradients(const std::vector<uint64_t>& ids, int dim, int step) {
  std::vector<float> g;
  for (uint64_t id : ids) {
    for (int k = 0; k < dim; ++k) g.push_back(0.01f * float((id * 7 + k * 3 + step) % 11) - 0.05f);
  }
  return g;
}

}  // namespace pst::embedding_testing

#endif  // PST_TESTS_PS_SERVER_CORE_EMBEDDING_TABLE_TESTING_H_
