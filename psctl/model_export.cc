#include "psctl/model_export.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps_server/core/checkpoint.h"
#include "ps_server/core/embedding_init.h"
#include "ps_server/core/replica_checkpoint_dirs.h"

namespace pst {
namespace {

// "<name>/part-<p>" -> (name, p); any other name -> (name, -1).
std::pair<std::string, int> SplitPart(const std::string& name) {
  const size_t at = name.rfind("/part-");
  if (at == std::string::npos) return {name, -1};
  const char* first = name.data() + at + 6;
  const char* last = name.data() + name.size();
  int part = -1;
  auto [end, error] = std::from_chars(first, last, part);
  if (error != std::errc() || end != last || first == last) return {name, -1};
  return {name.substr(0, at), part};
}

struct Slices {
  std::map<int, const ShardCheckpoint::Variable*> parts;  // -1: the whole variable
};

absl::StatusOr<NpzArray> JoinSlices(const std::string& name, const Slices& slices) {
  const auto missing = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable \"", name, "\" does not join: ", why,
        "; export the checkpoints of every shard of one run"));
  };
  if (slices.parts.count(-1) > 0) {
    if (slices.parts.size() > 1) return missing("it is both whole and cut into parts");
    const ShardCheckpoint::Variable& v = *slices.parts.at(-1);
    NpzArray a{name, NpzArray::DType::kFloat32, {v.shape().begin(), v.shape().end()}, v.values()};
    return a;
  }
  std::vector<int64_t> shape;
  std::string data;
  int expected = 0;
  for (const auto& [part, v] : slices.parts) {
    if (part != expected) return missing(absl::StrCat("part ", expected, " is in no shard"));
    ++expected;
    std::vector<int64_t> s(v->shape().begin(), v->shape().end());
    if (s.empty()) return missing(absl::StrCat("part ", part, " is a scalar"));
    if (shape.empty()) {
      shape = s;
    } else {
      if (!std::equal(s.begin() + 1, s.end(), shape.begin() + 1, shape.end())) {
        return missing(absl::StrCat("part ", part, "'s shape differs from part 0's past its rows"));
      }
      shape[0] += s[0];
    }
    data += v->values();
  }
  return NpzArray{name, NpzArray::DType::kFloat32, std::move(shape), std::move(data)};
}

}  // namespace

absl::StatusOr<std::vector<ShardCheckpoint>> ReadShardCheckpoints(const std::string& dir) {
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no checkpoint in ", dir, ": not a directory; give --checkpoint=training.checkpoint.dir "
        "of the job"));
  }
  // The shards any replica wrote checkpoints of (replica_checkpoint_dirs.h).
  int highest = -1;
  std::vector<std::string> roots = BackupCheckpointRoots(dir);
  roots.push_back(dir);
  for (const std::string& root : roots) {
    for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
      if (entry.is_directory(error)) {
        highest = std::max(highest, ShardOfCheckpointFolder(entry.path().filename().string()));
      }
    }
  }
  if (highest < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no checkpoint in ", dir, ": it holds no shard-<i> folder; give --checkpoint=the job's "
        "training.checkpoint.dir, where each PS writes <dir>/shard-<i>/"));
  }
  std::vector<ShardCheckpoint> shards;
  for (int i = 0; i <= highest; ++i) {
    // Each replica's newest: the latest version of the run holds the most
    // of it, and of one version the latest epoch's (HoldsMoreOfTheRun).
    const std::vector<std::string> folders = ReplicaCheckpointDirs(dir, i);
    std::vector<ShardCheckpoint> newest;
    std::vector<std::string> rejected;
    bool from_replica_zero = false;
    for (const std::string& folder : folders) {
      absl::StatusOr<ShardCheckpoint> checkpoint = ReadNewestValidCheckpoint(folder, &rejected);
      if (!checkpoint.ok()) continue;
      from_replica_zero = from_replica_zero || folder == folders[0];
      newest.push_back(*std::move(checkpoint));
    }
    if (newest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", i, " has no valid checkpoint in ", folders[0],
          folders.size() > 1 ? " or its backups' folders" : "", " (",
          rejected.empty() ? "no ckpt-*.bin file" : rejected.front(),
          "); every shard's is needed: copy that shard's checkpoints there, or export another "
          "directory"));
    }
    // The run is replica 0's, which moves another run's checkpoints aside
    // when it starts one (a backup's folder is of the run only if a replica
    // of its number took part).
    const ShardCheckpoint& run =
        !shards.empty()     ? shards[0]
        : from_replica_zero ? newest[0]
                            : *std::max_element(newest.begin(), newest.end(), HoldsMoreOfTheRun);
    ShardCheckpoint* chosen = nullptr;
    for (ShardCheckpoint& checkpoint : newest) {
      if (checkpoint.run_id() != run.run_id() || checkpoint.config_hash() != run.config_hash()) {
        continue;
      }
      if (chosen == nullptr || HoldsMoreOfTheRun(*chosen, checkpoint)) chosen = &checkpoint;
    }
    if (chosen == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the newest checkpoints in ", dir, "/shard-0 and ", folders[0],
          " come from different runs or configs; export a directory holding one run's"));
    }
    shards.push_back(std::move(*chosen));
  }
  for (const ShardCheckpoint& s : shards) {
    for (const ShardCheckpoint::Embedding& e : s.embeddings()) {
      if (e.num_shards() > static_cast<int>(shards.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table \"", e.config().name(), "\" was placed over ", e.num_shards(), " shards but ",
            dir, " holds shard-0 .. shard-", highest, " only; copy every shard's checkpoints "
            "there"));
      }
    }
  }
  return shards;
}

std::vector<NpzArray> TableArrays(const std::string& table, int dim, uint64_t seed, float scale,
                                  std::vector<uint64_t> ids, const std::vector<float>& values) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return static_cast<int64_t>(ids[a]) < static_cast<int64_t>(ids[b]);
  });
  std::vector<int64_t> sorted_ids(n);
  std::vector<float> rows(static_cast<size_t>(n) * dim);
  bool small = n > 0;
  uint64_t max_id = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t id = ids[order[i]];
    sorted_ids[i] = static_cast<int64_t>(id);
    std::memcpy(&rows[i * dim], &values[order[i] * dim], dim * sizeof(float));
    small = small && id < static_cast<uint64_t>(kDenseTableMaxIds);
    max_id = std::max(max_id, id);
  }
  small = small && static_cast<int64_t>(max_id) + 1 <= kDenseTableMaxRatio * n;
  std::vector<NpzArray> arrays;
  arrays.push_back(Int64Array(absl::StrCat(table, ".ids"), {n}, sorted_ids));
  arrays.push_back(Float32Array(absl::StrCat(table, ".rows"), {n, dim}, rows));
  if (small) {
    const int64_t all = static_cast<int64_t>(max_id) + 1;
    std::vector<float> dense(static_cast<size_t>(all) * dim);
    const uint64_t key = TableInitKey(seed, table);
    int64_t next = 0;  // into sorted_ids
    for (int64_t id = 0; id < all; ++id) {
      std::span<float> out(&dense[id * dim], dim);
      if (next < n && sorted_ids[next] == id) {
        std::memcpy(out.data(), &rows[next * dim], dim * sizeof(float));
        ++next;
      } else {
        InitialRow(key, static_cast<uint64_t>(id), scale, out);
      }
    }
    arrays.push_back(Float32Array(table, {all, dim}, dense));
  }
  return arrays;
}

absl::StatusOr<std::vector<NpzArray>> ModelArrays(const std::vector<ShardCheckpoint>& shards) {
  std::vector<std::string> order;
  std::map<std::string, Slices> variables;
  struct Table {
    const ShardCheckpoint::Embedding* first;
    std::vector<uint64_t> ids;
    std::vector<float> values;
  };
  std::vector<std::string> table_order;
  std::map<std::string, Table> tables;
  for (const ShardCheckpoint& shard : shards) {
    for (const ShardCheckpoint::Variable& v : shard.variables()) {
      auto [name, part] = SplitPart(v.name());
      if (variables.count(name) == 0) order.push_back(name);
      if (!variables[name].parts.emplace(part, &v).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable \"", v.name(), "\" is in two shards' checkpoints"));
      }
    }
    for (const ShardCheckpoint::Embedding& e : shard.embeddings()) {
      const std::string& name = e.config().name();
      auto [it, added] = tables.try_emplace(name, Table{&e, {}, {}});
      if (added) table_order.push_back(name);
      const size_t n = e.ids().size() / sizeof(uint64_t);
      const size_t dim = static_cast<size_t>(e.config().dim());
      if (e.config().dim() != it->second.first->config().dim() ||
          e.values().size() != n * dim * sizeof(float)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table \"", name, "\": the shards' checkpoints disagree on its rows' size"));
      }
      const size_t before = it->second.ids.size();
      it->second.ids.resize(before + n);
      if (n > 0) std::memcpy(&it->second.ids[before], e.ids().data(), n * sizeof(uint64_t));
      it->second.values.resize((before + n) * dim);
      if (n > 0) std::memcpy(&it->second.values[before * dim], e.values().data(), e.values().size());
    }
  }
  std::vector<NpzArray> arrays;
  std::set<std::string> names;
  for (const std::string& name : order) {
    absl::StatusOr<NpzArray> a = JoinSlices(name, variables[name]);
    if (!a.ok()) return a.status();
    names.insert(name);
    arrays.push_back(*std::move(a));
  }
  const auto add = [&](std::vector<NpzArray> table_arrays) -> absl::Status {
    for (NpzArray& a : table_arrays) {
      if (!names.insert(a.name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("the model has two arrays named \"", a.name,
                         "\" (a variable's, a table's or a table part's)"));
      }
      arrays.push_back(std::move(a));
    }
    return absl::OkStatus();
  };
  for (const std::string& name : table_order) {
    Table& t = tables[name];
    const EmbeddingTableConfig& config = t.first->config();
    if (config.parts().empty()) {
      PST_RETURN_IF_ERROR(add(TableArrays(name, config.dim(), t.first->seed(), config.init_scale(),
                                          std::move(t.ids), t.values)));
      continue;
    }
    // Each part as the table it stands for.
    const size_t dim = static_cast<size_t>(config.dim());
    const size_t n = t.ids.size();
    size_t column = 0;
    for (const EmbeddingTablePart& part : config.parts()) {
      const size_t part_dim = static_cast<size_t>(part.dim());
      std::vector<float> values(n * part_dim);
      for (size_t i = 0; i < n; ++i) {
        std::memcpy(&values[i * part_dim], &t.values[i * dim + column], part_dim * sizeof(float));
      }
      PST_RETURN_IF_ERROR(add(
          TableArrays(part.name(), part.dim(), t.first->seed(), part.init_scale(), t.ids, values)));
      column += part_dim;
    }
  }
  return arrays;
}

}  // namespace pst
